/*
 * opcheck.h: the op-matrix checker that test_ops and test_multi run in every rank.
 */
#ifndef TESTS_OPCHECK_H
#define TESTS_OPCHECK_H

#include <stddef.h>

#include "coll/coll.h"

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

/* Premultiplied sums on g, every rank with a scalar of its own: allreduce, reduce and
 * reduce_scatter of int32, uint8 (products past 255), float32 and float64, of 24 and
 * big elements per block, each element checked exactly; the same (dtype, scalar) pair
 * again is the same op, a destroyed op's pair comes back, and an op of another dtype is
 * refused before anything is sent. in holds big x size elements of 8 bytes, out big.
 * Every rank of g calls it. 0, or a failure code (150+). */
int opcheck_premul(coll_conn *c, coll_group *g, void *in, void *out, size_t big);

#endif
