/*
 * config_priv.h: the schema of the config (config_schema.c), as the loader
 * (config.c) walks it: one table of fields per mapping.
 */
#ifndef AGENT_CONFIG_PRIV_H
#define AGENT_CONFIG_PRIV_H

#include <stddef.h>

enum ftype { T_STR, T_INT, T_ENUM, T_INT_LIST, T_STR_LIST, T_MAP, T_MAP_LIST };

struct field {
    const char *key;
    enum ftype type;
    size_t off;         /* of the value inside the enclosing struct */
    size_t size;        /* T_STR: capacity; lists: element size */
    long long min, max; /* T_INT and list items */
    const char *const *enums;
    const char *def;         /* default, parsed like a YAML value; NULL: zero */
    const struct field *sub; /* T_MAP, T_MAP_LIST */
    size_t count_off;        /* lists: int counter */
    int cap;                 /* lists: capacity */
    int required;
};

/* The top level of the file. */
extern const struct field config_root_fields[];

#endif
