/*
 * cudrv.h: the CUDA driver entry points that libcoll and the agent's NCCL backend
 * need (cuMem sharing, stream memory operations), reached through the CUDA runtime
 * (cudaGetDriverEntryPointByVersion) so that nothing links libcuda: binaries start on
 * machines without a GPU driver. Also the cuMem helpers both sides of a shared GPU
 * buffer use. Compiled only where the CUDA runtime is found (COLL_HAVE_CUDA).
 */
#ifndef COLL_CUDRV_H
#define COLL_CUDRV_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

struct cudrv {
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*mem_export)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                           unsigned long long);
    CUresult (*mem_import)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*mem_granularity)(size_t *, const CUmemAllocationProp *,
                                CUmemAllocationGranularity_flags);
    CUresult (*addr_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                        unsigned long long);
    CUresult (*mem_unmap)(CUdeviceptr, size_t);
    CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*wait_value64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
    CUresult (*write_value64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
    CUresult (*device_uuid)(CUuuid *, CUdevice);
    CUresult (*error_string)(CUresult, const char **);
    CUresult (*addr_range)(CUdeviceptr *, size_t *, CUdeviceptr);
};

/* The table, loaded once (thread-safe). NULL when the runtime finds no driver or an
 * entry point is missing; why then says which. */
const struct cudrv *cudrv_get(char *why, size_t whylen);
/* Text for a driver error ("CUDA_ERROR_..." style), never NULL. */
const char *cudrv_str(CUresult r);

/* A cuMem allocation mapped read-write for one device. */
struct cumem {
    CUdeviceptr ptr;
    size_t size; /* mapped size: the request rounded up to the granularity */
    CUmemGenericAllocationHandle handle;
};

/* Allocate size bytes on device (an ordinal of this process) exportable as a POSIX
 * fd; map them. Returns 0 or -1 with why. */
int cumem_alloc(struct cumem *m, int device, size_t size, char *why, size_t whylen);
/* Export the allocation as a new fd (the caller closes it). -1 on failure. */
int cumem_export_fd(const struct cumem *m, char *why, size_t whylen);
/* Import an exported fd (the caller keeps it) of size bytes and map it for device.
 * Returns 0 or -1 with why. */
int cumem_import_fd(struct cumem *m, int fd, size_t size, int device, char *why, size_t whylen);
/* Unmap and release; a zeroed struct is a no-op. */
void cumem_free(struct cumem *m);

/* The device ordinal of this process whose UUID is uuid, or -1. */
int cudrv_device_by_uuid(const uint8_t uuid[16]);
/* UUID of a device ordinal; 0 or -1. */
int cudrv_device_uuid(int device, uint8_t uuid[16]);
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" for uuid (out holds >= 41 bytes). */
void cudrv_uuid_str(const uint8_t uuid[16], char *out, size_t outlen);
/* Parse such a string (the "GPU-" prefix is optional); 0 or -1. */
int cudrv_uuid_parse(const char *s, uint8_t uuid[16]);

#endif
