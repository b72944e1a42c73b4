/*
 * opcheck.h: the op-matrix checker that test_ops and test_multi run in every rank.
 */
#ifndef TESTS_OPCHECK_H
#define TESTS_OPCHECK_H

struct opcheck_job {
    const char *sock;
    const char *group; /* NULL: "g" */
    int explicit_slot;
    int slot;
    /* GPU groups: buffers on this device (a CUDA ordinal), shared through cuMem (or
     * legacy CUDA IPC with ipc); inputs copied in and results out with async copies on
     * one stream, the op ordered on that stream. 0: host buffers. */
    int on_gpu;
    int device;
    int ipc;
    /* split_mod > 0: run the matrix on a child of the group instead, split by color
     * (rank / split_div) % split_mod, key -rank (the parent's order reversed); the
     * parent stays open until every rank is done */
    int split_mod, split_div;
};

/* Connect, open the group, run the matrix, return the number of failures (<= 99);
 * 100+ for setup failures. For child_run. */
int opcheck_rank_main(void *arg);

#endif
