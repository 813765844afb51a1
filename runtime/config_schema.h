/* The schema of the configuration (runtime/config_schema.c): a row per key. Read by
 * runtime/config.c, which does everything else with it; not part of the interface. */
#ifndef PT_RUNTIME_CONFIG_SCHEMA_H
#define PT_RUNTIME_CONFIG_SCHEMA_H

#include <stddef.h>

/* KEY_CHOICE: one of a list of names (runtime/settings.h), held as its number. */
typedef enum key_type {
    KEY_INT,
    KEY_LONG,
    KEY_LLONG,
    KEY_DOUBLE,
    KEY_BOOL,
    KEY_STRING,
    KEY_CHOICE
} key_type;

/* Allowed values of a number: min..max, each end open or closed. */
enum { CLOSED = 0, OPEN_MIN = 1, OPEN_MAX = 2 };
typedef struct key_range {
    double min, max; /* ±HUGE_VAL where unbounded */
    int open;        /* OPEN_MIN | OPEN_MAX */
} key_range;

typedef struct config_key {
    const char *name;      /* "train.lr" */
    key_type type;         /* the C type of the field */
    size_t offset, size;   /* of the field in struct pipert_config */
    double default_number; /* integers, bools (0/1) and doubles */
    const char *default_string;
    key_range range;       /* numbers */
    const char *const *names; /* KEY_CHOICE: the name of each value, indexed by it */
    int n_names;
    const char *doc;
} config_key;

/* Every key, in the order of docs/CONFIG.md and the JSON dump. */
extern const config_key pt_config_schema[];
extern const int pt_config_key_count;

#endif
