/*
 * lcgpu.c: the GPU half of libcoll's buffer code (see lcgpu.h).
 */
#include "lcgpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef COLL_HAVE_CUDA

static int none(char *why, size_t whylen)
{
    snprintf(why, whylen, "libcoll was built without CUDA");
    return -1;
}
int lcgpu_alloc(int device, size_t size, void **ptr, size_t *mapped, int *fd, uint8_t uuid[16],
                struct lcgpu_mem **h, char *why, size_t whylen)
{
    (void)device, (void)size, (void)ptr, (void)mapped, (void)fd, (void)uuid, (void)h;
    return none(why, whylen);
}
void lcgpu_free(struct lcgpu_mem *h)
{
    (void)h;
}
int lcgpu_ipc(const void *ptr, size_t size, int *device, uint8_t uuid[16], uint8_t ipc[64],
              uint64_t *offset, char *why, size_t whylen)
{
    (void)ptr, (void)size, (void)device, (void)uuid, (void)ipc, (void)offset;
    return none(why, whylen);
}
int lcgpu_register(void *p, size_t size, intptr_t *delta, char *why, size_t whylen)
{
    (void)p, (void)size, (void)delta;
    return none(why, whylen);
}
int lcgpu_write(void *stream, void *dev_addr, uint64_t v, char *why, size_t whylen)
{
    (void)stream, (void)dev_addr, (void)v;
    return none(why, whylen);
}
int lcgpu_wait(void *stream, void *dev_addr, uint64_t v, char *why, size_t whylen)
{
    (void)stream, (void)dev_addr, (void)v;
    return none(why, whylen);
}
int lcgpu_stream_idle(void *stream)
{
    (void)stream;
    return 0;
}

int lcgpu_device(int *device, char *why, size_t whylen)
{
    (void)device;
    snprintf(why, whylen, "built without CUDA");
    return -1;
}

int lcgpu_copy(void *dst, const void *src, size_t n, char *why, size_t whylen)
{
    (void)dst, (void)src, (void)n;
    snprintf(why, whylen, "built without CUDA");
    return -1;
}

int lcgpu_copy_on(void *stream, void *dst, const void *src, size_t n, char *why, size_t whylen)
{
    (void)stream, (void)dst, (void)src, (void)n;
    snprintf(why, whylen, "built without CUDA");
    return -1;
}

#else

#include <cuda_runtime_api.h>

#include "cudrv.h"

struct lcgpu_mem {
    struct cumem m;
};

int lcgpu_alloc(int device, size_t size, void **ptr, size_t *mapped, int *fd, uint8_t uuid[16],
                struct lcgpu_mem **h, char *why, size_t whylen)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device >= n) {
        cudaGetLastError();
        snprintf(why, whylen, "device %d: this process sees %d GPU(s)", device, n);
        return -1;
    }
    struct lcgpu_mem *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    if (cumem_alloc(&x->m, device, size, why, whylen) < 0) {
        free(x);
        return -1;
    }
    *fd = cumem_export_fd(&x->m, why, whylen);
    if (*fd < 0 || cudrv_device_uuid(device, uuid) < 0) {
        if (*fd >= 0) snprintf(why, whylen, "cannot read the UUID of device %d", device);
        cumem_free(&x->m);
        free(x);
        return -1;
    }
    *ptr = (void *)(uintptr_t)x->m.ptr;
    *mapped = x->m.size;
    *h = x;
    return 0;
}

void lcgpu_free(struct lcgpu_mem *h)
{
    if (!h) return;
    cumem_free(&h->m);
    free(h);
}

int lcgpu_ipc(const void *ptr, size_t size, int *device, uint8_t uuid[16], uint8_t ipc[64],
              uint64_t *offset, char *why, size_t whylen)
{
    const struct cudrv *d = cudrv_get(why, whylen);
    if (!d) return -1;
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, ptr);
    if (e != cudaSuccess || a.type != cudaMemoryTypeDevice) {
        cudaGetLastError();
        snprintf(why, whylen, "%p is not device memory from cudaMalloc", ptr);
        return -1;
    }
    CUdeviceptr base = 0;
    size_t asize = 0;
    if (d->addr_range(&base, &asize, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS) {
        snprintf(why, whylen, "cannot find the allocation that holds %p", ptr);
        return -1;
    }
    *offset = (uint64_t)((uintptr_t)ptr - (uintptr_t)base);
    if (size > asize - *offset) {
        snprintf(why, whylen, "%zu bytes from %p run past the end of its allocation", size, ptr);
        return -1;
    }
    cudaIpcMemHandle_t h;
    e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, whylen, "cudaIpcGetMemHandle: %s", cudaGetErrorString(e));
        return -1;
    }
    _Static_assert(sizeof(h) == 64, "CUDA IPC handle size");
    memcpy(ipc, &h, sizeof(h));
    *device = a.device;
    if (cudrv_device_uuid(a.device, uuid) < 0) {
        snprintf(why, whylen, "cannot read the UUID of device %d", a.device);
        return -1;
    }
    return 0;
}

int lcgpu_register(void *p, size_t size, intptr_t *delta, char *why, size_t whylen)
{
    if (!cudrv_get(why, whylen)) return -1;
    cudaError_t e = cudaHostRegister(p, size, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, whylen, "cudaHostRegister of the session region: %s", cudaGetErrorString(e));
        return -1;
    }
    void *dp = NULL;
    e = cudaHostGetDevicePointer(&dp, p, 0);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaHostUnregister(p);
        snprintf(why, whylen, "cudaHostGetDevicePointer: %s", cudaGetErrorString(e));
        return -1;
    }
    *delta = (intptr_t)dp - (intptr_t)p;
    return 0;
}

int lcgpu_write(void *stream, void *dev_addr, uint64_t v, char *why, size_t whylen)
{
    const struct cudrv *d = cudrv_get(why, whylen);
    if (!d) return -1;
    CUresult r = d->write_value64((CUstream)stream, (CUdeviceptr)(uintptr_t)dev_addr, v,
                                  CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r != CUDA_SUCCESS) {
        snprintf(why, whylen, "cuStreamWriteValue64 on stream %p: %s", stream, cudrv_str(r));
        return -1;
    }
    return 0;
}

int lcgpu_stream_idle(void *stream)
{
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    if (e == cudaSuccess) return 1;
    if (e != cudaErrorNotReady) cudaGetLastError();
    return 0;
}

int lcgpu_wait(void *stream, void *dev_addr, uint64_t v, char *why, size_t whylen)
{
    const struct cudrv *d = cudrv_get(why, whylen);
    if (!d) return -1;
    CUresult r = d->wait_value64((CUstream)stream, (CUdeviceptr)(uintptr_t)dev_addr, v,
                                 CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
        snprintf(why, whylen, "cuStreamWaitValue64 on stream %p: %s", stream, cudrv_str(r));
        return -1;
    }
    return 0;
}

int lcgpu_device(int *device, char *why, size_t whylen)
{
    cudaError_t e = cudaGetDevice(device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, whylen, "cudaGetDevice: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

int lcgpu_copy(void *dst, const void *src, size_t n, char *why, size_t whylen)
{
    cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, whylen, "cudaMemcpy of %zu bytes: %s", n, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

int lcgpu_copy_on(void *stream, void *dst, const void *src, size_t n, char *why, size_t whylen)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, whylen, "cudaMemcpyAsync of %zu bytes: %s", n, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

#endif
