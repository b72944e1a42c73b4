/*
 * common.c: tables shared by libcoll and the agent: error strings, dtype sizes and
 * names. Pure functions, no state.
 */
#include "coll/coll.h"

struct err_info {
    const char *msg;
    int retry;
};

static const struct err_info err_table[] = {
#define COLL_X_TABLE(name, value, retry, msg) [value] = {msg, retry},
    COLL_ERRORS(COLL_X_TABLE)
#undef COLL_X_TABLE
};

#define ERR_COUNT (sizeof(err_table) / sizeof(err_table[0]))

const char *coll_strerror(coll_err err)
{
    if ((unsigned)err >= ERR_COUNT || !err_table[err].msg) return "unknown error";
    return err_table[err].msg;
}

int coll_err_retryable(coll_err err)
{
    return (unsigned)err < ERR_COUNT && err_table[err].retry;
}

static const unsigned char dtype_size[COLL_DTYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4,
                                                           8, 2, 2, 1, 1, 1, 8, 16};
static const char *const dtype_names[COLL_DTYPE_COUNT] = {
    "int8",    "uint8",       "int32",       "uint32",    "int64",      "uint64",
    "float16", "bfloat16",    "float32",     "float64",   "int16",      "uint16",
    "bool",    "float8_e4m3", "float8_e5m2", "complex64", "complex128",
};
static const char *const redop_names[COLL_REDOP_COUNT] = {"sum", "prod", "min", "max",
                                                          "avg", "band", "bor", "bxor"};

size_t coll_dtype_size(coll_dtype dt)
{
    return (unsigned)dt < COLL_DTYPE_COUNT ? dtype_size[dt] : 0;
}

const char *coll_dtype_name(coll_dtype dt)
{
    return (unsigned)dt < COLL_DTYPE_COUNT ? dtype_names[dt] : "?";
}

const char *coll_redop_name(coll_redop op)
{
    if ((unsigned)op >= COLL_PREMUL_SUM_FIRST && (unsigned)op < COLL_PREMUL_SUM_FIRST + 128u)
        return "premul_sum";
    return (unsigned)op < COLL_REDOP_COUNT ? redop_names[op] : "?";
}

#define STR2(x) #x
#define STR(x) STR2(x)
const char *coll_version(void)
{
    return STR(COLL_VERSION_MAJOR) "." STR(COLL_VERSION_MINOR) "." STR(COLL_VERSION_PATCH);
}
