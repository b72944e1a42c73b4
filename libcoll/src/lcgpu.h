/*
 * lcgpu.h: the GPU half of libcoll's buffer code, without CUDA types, so that
 * libcoll.c builds alike with and without CUDA. Every function returns 0, or -1 with
 * a one-line reason in why ("built without CUDA" where CUDA is absent).
 */
#ifndef COLL_LCGPU_H
#define COLL_LCGPU_H

#include <stddef.h>
#include <stdint.h>

struct lcgpu_mem;

/* Allocate size bytes on device (this process's ordinal) as cuMem memory exportable
 * as a POSIX fd: *ptr its device address, *mapped the size rounded to the
 * allocation granularity, *fd an exported descriptor (the caller closes it), uuid the
 * device's. *h releases it (lcgpu_free). */
int lcgpu_alloc(int device, size_t size, void **ptr, size_t *mapped, int *fd, uint8_t uuid[16],
                struct lcgpu_mem **h, char *why, size_t whylen);
void lcgpu_free(struct lcgpu_mem *h);
/* Describe [ptr, ptr + size) of cudaMalloc memory for legacy CUDA IPC: the handle of
 * its allocation, the offset of ptr in it, the device. */
int lcgpu_ipc(const void *ptr, size_t size, int *device, uint8_t uuid[16], uint8_t ipc[64],
              uint64_t *offset, char *why, size_t whylen);
/* Register host memory (the session region) so streams can read and write it;
 * *delta turns a host address in it into the GPU's. */
int lcgpu_register(void *p, size_t size, intptr_t *delta, char *why, size_t whylen);
/* Enqueue on stream (a cudaStream_t; NULL: the legacy default stream) a write of v to
 * the 64-bit word at dev_addr, after the stream's earlier work. */
int lcgpu_write(void *stream, void *dev_addr, uint64_t v, char *why, size_t whylen);
/* 1 if every piece of work enqueued on stream so far has finished, else 0. */
int lcgpu_stream_idle(void *stream);
/* Enqueue on stream a wait until the word at dev_addr is >= v (wrap-safe). */
int lcgpu_wait(void *stream, void *dev_addr, uint64_t v, char *why, size_t whylen);

/* The calling thread's current CUDA device (cudaGetDevice). */
int lcgpu_device(int *device, char *why, size_t whylen);
/* Copy n bytes between host and device memory (either way), finished on return. */
int lcgpu_copy(void *dst, const void *src, size_t n, char *why, size_t whylen);
/* Enqueue on stream (NULL: the legacy default stream) a copy of n bytes, any way. */
int lcgpu_copy_on(void *stream, void *dst, const void *src, size_t n, char *why, size_t whylen);

#endif
