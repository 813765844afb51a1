#include "tools/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/config.h"
#include "runtime/error.h"

static void print_help(const pt_cli *cli, FILE *out)
{
    fprintf(out, "usage: pipert %s %s\n\n%s\n\noptions:\n", cli->command, cli->synopsis,
            cli->description);
    for (int i = 0; i < cli->n_flags; i++) {
        const pt_cli_flag *f = &cli->flags[i];
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", f->name, f->metavar ? " " : "",
                 f->metavar ? f->metavar : "");
        fprintf(out, "  %-22s %s\n", left, f->help);
    }
    if (cli->takes_config) {
        fprintf(out, "  %-22s %s\n", "--config FILE", "JSON configuration (see docs/CONFIG.md)");
        fprintf(out, "  %-22s %s\n\nconfiguration keys:\n", "--section.key=VALUE",
                "override one configuration key (after --config)");
        pt_config_print_help(out);
    }
    fprintf(out, "  %-22s %s\n", "--help", "show this help");
}

static const pt_cli_flag *find_flag(const pt_cli *cli, const char *name)
{
    for (int i = 0; i < cli->n_flags; i++)
        if (!strcmp(cli->flags[i].name, name)) return &cli->flags[i];
    return NULL;
}

static pt_cli_outcome usage_error(const pt_cli *cli, const char *fmt, const char *arg)
{
    fprintf(stderr, "pipert %s: ", cli->command);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: pipert %s %s   (--help for more)\n", cli->command, cli->synopsis);
    return PT_CLI_USAGE_ERROR;
}

static pt_cli_outcome config_error(const pt_cli *cli)
{
    fprintf(stderr, "pipert %s: error: %s\n", cli->command, pipert_last_error());
    return PT_CLI_CONFIG_ERROR;
}

/* An override is "--a.b=value" or "--seed=value": a name with '=' after it. */
static bool is_override(const char *arg) { return !strncmp(arg, "--", 2) && strchr(arg, '='); }

static pt_cli_outcome parse_flags(const pt_cli *cli, int argc, char **argv, const char **config_file)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            print_help(cli, stdout);
            return PT_CLI_HELP_SHOWN;
        }
        if (cli->takes_config && !strcmp(arg, "--config")) {
            if (++i == argc) return usage_error(cli, "%s needs a value", arg);
            *config_file = argv[i];
            continue;
        }
        if (cli->takes_config && is_override(arg)) continue; /* second pass */
        const pt_cli_flag *flag = find_flag(cli, arg);
        if (!flag) return usage_error(cli, "unknown option '%s'", arg);
        if (flag->present) *flag->present = true;
        if (flag->metavar) {
            if (++i == argc) return usage_error(cli, "%s needs a value", arg);
            *flag->value = argv[i];
        }
    }
    return PT_CLI_OK;
}

pipert_result pt_cli_parse_int(const char *flag, const char *text, long min, long max,
                               int fallback, int *out)
{
    *out = fallback;
    if (!text) return PIPERT_OK;
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (end == text || *end || errno || value < min || value > max)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: expected an integer in [%ld, %ld], got '%s'",
                       flag, min, max, text);
    *out = (int)value;
    return PIPERT_OK;
}

pipert_result pt_cli_apply_overrides(int argc, char **argv, pipert_config *cfg)
{
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) i++;
        else if (is_override(argv[i])) PT_TRY(pipert_config_set(cfg, argv[i]));
    }
    return PIPERT_OK;
}

static pipert_result build_config(const pt_cli *cli, int argc, char **argv,
                                  const char *config_file, pipert_config *cfg)
{
    for (const char *const *s = cli->base_settings; s && *s; s++) PT_TRY(pipert_config_set(cfg, *s));
    if (config_file) PT_TRY(pipert_config_load_file(cfg, config_file));
    PT_TRY(pt_cli_apply_overrides(argc, argv, cfg));
    return pt_config_validate(cfg);
}

pt_cli_outcome pt_cli_parse(const pt_cli *cli, int argc, char **argv, pipert_config **cfg)
{
    const char *config_file = NULL;
    if (cfg) *cfg = NULL;
    pt_cli_outcome outcome = parse_flags(cli, argc, argv, &config_file);
    if (outcome != PT_CLI_OK || !cli->takes_config) return outcome;
    if (pipert_config_create(cfg) != PIPERT_OK ||
        build_config(cli, argc, argv, config_file, *cfg) != PIPERT_OK) {
        outcome = config_error(cli);
        pipert_config_free(*cfg);
        *cfg = NULL;
    }
    return outcome;
}

int pt_cli_exit_status(pt_cli_outcome outcome)
{
    switch (outcome) {
    case PT_CLI_OK:
    case PT_CLI_HELP_SHOWN: return 0;
    case PT_CLI_USAGE_ERROR: return 2;
    case PT_CLI_CONFIG_ERROR: return 1;
    }
    return 1;
}
