/*
 * fuzz_config.c: the YAML config loader (agent/config.c) on arbitrary text. Any file
 * gives a config or errors, within the loader's bounds on size, depth and aliases.
 */
#include <stdint.h>
#include <stdlib.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct config *c = config_new();
    if (!c) return 0;
    char *err = NULL;
    int rc = config_load_string(c, (const char *)data, size, "fuzz.yaml", &err);
    if (rc < 0 && !err) __builtin_trap(); /* a failure must say why */
    free(err);
    config_free(&c);
    return 0;
}
