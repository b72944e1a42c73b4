/*
 * cudrv.c: driver entry points through the runtime, and cuMem sharing helpers.
 */
#include "cudrv.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

static struct cudrv table;
static int table_ok;
static char table_why[160];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static int load(const char *sym, void **fn)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    /* 12.0 ABI of each symbol: the _v2 stream memory operations, the cuMem calls */
    cudaError_t e = cudaGetDriverEntryPointByVersion(sym, fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn) {
        snprintf(table_why, sizeof(table_why), "driver entry point %s: %s", sym,
                 e != cudaSuccess ? cudaGetErrorString(e) : "not found");
        return -1;
    }
    return 0;
}

static void load_all(void)
{
    int n = 0;
    /* cudaGetDeviceCount initialises the runtime and says why there is no driver */
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(table_why, sizeof(table_why), "CUDA runtime: %s", cudaGetErrorString(e));
        return;
    }
#define L(field, sym)                                                                              \
    if (load(sym, (void **)&table.field) < 0) return;
    L(mem_create, "cuMemCreate");
    L(mem_release, "cuMemRelease");
    L(mem_export, "cuMemExportToShareableHandle");
    L(mem_import, "cuMemImportFromShareableHandle");
    L(mem_granularity, "cuMemGetAllocationGranularity");
    L(addr_reserve, "cuMemAddressReserve");
    L(addr_free, "cuMemAddressFree");
    L(mem_map, "cuMemMap");
    L(mem_unmap, "cuMemUnmap");
    L(mem_set_access, "cuMemSetAccess");
    L(wait_value64, "cuStreamWaitValue64");
    L(write_value64, "cuStreamWriteValue64");
    L(device_uuid, "cuDeviceGetUuid");
    L(error_string, "cuGetErrorString");
    L(addr_range, "cuMemGetAddressRange");
#undef L
    table_ok = 1;
}

const struct cudrv *cudrv_get(char *why, size_t whylen)
{
    pthread_once(&table_once, load_all);
    if (!table_ok && why) snprintf(why, whylen, "%s", table_why);
    return table_ok ? &table : NULL;
}

const char *cudrv_str(CUresult r)
{
    const char *s = NULL;
    if (table_ok && table.error_string(r, &s) == CUDA_SUCCESS && s) return s;
    return "unknown CUDA driver error";
}

static void prop_for(CUmemAllocationProp *p, int device)
{
    memset(p, 0, sizeof(*p));
    p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->location.id = device;
    p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* A driver call whose failure ends the function: why gets the call's name and the
 * driver's words, then control jumps to label, named after what must be undone (the
 * labels fall through in reverse order of the steps). */
#define TRY(call, what, label)                                                                     \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            snprintf(why, whylen, "%s: %s", what, cudrv_str(r_));                                  \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Reserve, map and enable m->handle (m->size bytes) for device. */
static int map_for(struct cumem *m, int device, char *why, size_t whylen)
{
    const struct cudrv *d = &table;
    TRY(d->addr_reserve(&m->ptr, m->size, 0, 0, 0), "cuMemAddressReserve", failed);
    TRY(d->mem_map(m->ptr, m->size, 0, m->handle, 0), "cuMemMap", free_range);
    CUmemAccessDesc a = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    TRY(d->mem_set_access(m->ptr, m->size, &a, 1), "cuMemSetAccess", unmap);
    return 0;
unmap:
    d->mem_unmap(m->ptr, m->size);
free_range:
    d->addr_free(m->ptr, m->size);
failed:
    m->ptr = 0;
    return -1;
}

int cumem_alloc(struct cumem *m, int device, size_t size, char *why, size_t whylen)
{
    memset(m, 0, sizeof(*m));
    const struct cudrv *d = cudrv_get(why, whylen);
    if (!d) return -1;
    CUmemAllocationProp p;
    prop_for(&p, device);
    size_t gran = 0;
    TRY(d->mem_granularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity", failed);
    if (gran == 0) gran = 2u << 20;
    m->size = (size + gran - 1) / gran * gran;
    TRY(d->mem_create(&m->handle, m->size, &p, 0), "cuMemCreate", failed);
    if (map_for(m, device, why, whylen) < 0) goto release;
    return 0;
release:
    d->mem_release(m->handle);
failed:
    memset(m, 0, sizeof(*m));
    return -1;
}

int cumem_export_fd(const struct cumem *m, char *why, size_t whylen)
{
    int fd = -1;
    TRY(table.mem_export(&fd, m->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle", failed);
    return fd;
failed:
    return -1;
}

int cumem_import_fd(struct cumem *m, int fd, size_t size, int device, char *why, size_t whylen)
{
    memset(m, 0, sizeof(*m));
    const struct cudrv *d = cudrv_get(why, whylen);
    if (!d) return -1;
    TRY(d->mem_import(&m->handle, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle", failed);
    m->size = size;
    if (map_for(m, device, why, whylen) < 0) goto release;
    return 0;
release:
    d->mem_release(m->handle);
failed:
    memset(m, 0, sizeof(*m));
    return -1;
}

void cumem_free(struct cumem *m)
{
    if (!m->ptr || !table_ok) return;
    table.mem_unmap(m->ptr, m->size);
    table.addr_free(m->ptr, m->size);
    table.mem_release(m->handle);
    memset(m, 0, sizeof(*m));
}

int cudrv_device_uuid(int device, uint8_t uuid[16])
{
    if (!cudrv_get(NULL, 0)) return -1;
    CUuuid u;
    if (table.device_uuid(&u, (CUdevice)device) != CUDA_SUCCESS) return -1;
    memcpy(uuid, u.bytes, 16);
    return 0;
}

int cudrv_device_by_uuid(const uint8_t uuid[16])
{
    int n = 0;
    if (!cudrv_get(NULL, 0) || cudaGetDeviceCount(&n) != cudaSuccess) return -1;
    for (int i = 0; i < n; i++) {
        uint8_t u[16];
        if (cudrv_device_uuid(i, u) == 0 && memcmp(u, uuid, 16) == 0) return i;
    }
    return -1;
}

void cudrv_uuid_str(const uint8_t u[16], char *out, size_t outlen)
{
    snprintf(out, outlen,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
}

int cudrv_uuid_parse(const char *s, uint8_t u[16])
{
    if (strncmp(s, "GPU-", 4) == 0) s += 4;
    int n = 0;
    for (; *s && n < 32; s++) {
        if (*s == '-') continue;
        if (!isxdigit((unsigned char)*s)) return -1;
        int v = isdigit((unsigned char)*s) ? *s - '0' : (tolower((unsigned char)*s) - 'a' + 10);
        if (n % 2 == 0)
            u[n / 2] = (uint8_t)(v << 4);
        else
            u[n / 2] |= (uint8_t)v;
        n++;
    }
    return n == 32 && *s == '\0' ? 0 : -1;
}
