/* Command-line parsing shared by the subcommands: their own flags, plus
 * "--config FILE" and any "--section.key=value" configuration override
 * (applied after the file, in order). */
#ifndef PT_CLI_H
#define PT_CLI_H

#include <stdbool.h>

#include "pipert/pipert.h"

typedef struct pt_cli_flag {
    const char *name;   /* "--out" */
    const char *metavar; /* "DIR", or NULL for a switch */
    const char *help;
    const char **value; /* where a value goes (flags with a metavar) */
    bool *present;      /* set when the flag is given (switches) */
} pt_cli_flag;

typedef struct pt_cli {
    const char *command;  /* "train" */
    const char *synopsis; /* "[--config FILE] [--key=value ...] --out DIR" */
    const char *description;
    const pt_cli_flag *flags;
    int n_flags;
    bool takes_config;    /* accepts --config and --key=value */
    /* Assignments applied before --config and the overrides: a command's own
     * defaults (bench's reference model). NULL-terminated, or NULL. */
    const char *const *base_settings;
} pt_cli;

typedef enum pt_cli_outcome { PT_CLI_OK, PT_CLI_HELP_SHOWN, PT_CLI_USAGE_ERROR, PT_CLI_CONFIG_ERROR } pt_cli_outcome;

/* Parses argv; with cli->takes_config, fills *cfg (created here; the caller
 * frees it) from defaults, --config and overrides. On a usage or configuration
 * error the message is printed and *cfg is NULL. The exit status for an
 * outcome: */
pt_cli_outcome pt_cli_parse(const pt_cli *cli, int argc, char **argv, pipert_config **cfg);
int pt_cli_exit_status(pt_cli_outcome outcome);

/* An integer flag value in [min, max], the whole of `text`; NULL text gives
 * `fallback`. Otherwise PIPERT_ERR_INVALID_ARG naming the flag and the range. */
pipert_result pt_cli_parse_int(const char *flag, const char *text, long min, long max,
                               int fallback, int *out);

/* Applies the --section.key=value arguments of argv to cfg again (for a
 * command that rebuilds its configuration from a file first). */
pipert_result pt_cli_apply_overrides(int argc, char **argv, pipert_config *cfg);

#endif
