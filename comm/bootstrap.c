#include "comm/bootstrap.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- environment lookups --------------------------------------------------- */

const char *pt_env_lookup(const char *const *envp, const char *name)
{
    const size_t length = strlen(name);
    for (const char *const *entry = envp; entry && *entry; entry++)
        if (!strncmp(*entry, name, length) && (*entry)[length] == '=') return *entry + length + 1;
    return NULL;
}

/* A decimal integer in [min, max], the whole of `text`. */
static bool parse_int(const char *text, long min, long max, long *value)
{
    if (!text || !*text) return false;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end != '\0' || v < min || v > max) return false;
    /* strtol skips leading spaces and takes a sign: accept neither. */
    if (text[0] != '-' && (text[0] < '0' || text[0] > '9')) return false;
    *value = v;
    return true;
}

/* Variable `name` as an int in [min, max]; *present tells whether it is set
 * (NULL: the variable is required). */
static pipert_result env_int(const char *const *envp, const char *name, long min, long max,
                             int *value, bool *present)
{
    const char *text = pt_env_lookup(envp, name);
    if (present) *present = text != NULL;
    if (!text) {
        if (present) return PIPERT_OK;
        return pt_fail(PIPERT_ERR_CONFIG, "%s is not set", name);
    }
    long v;
    if (!parse_int(text, min, max, &v))
        return pt_fail(PIPERT_ERR_CONFIG, "%s='%s': expected an integer in [%ld, %ld]", name, text,
                       min, max);
    *value = (int)v;
    return PIPERT_OK;
}

/* ---- host:port --------------------------------------------------------------- */

pipert_result pt_parse_host_port(const char *text, const char *variable, char *host,
                                 size_t host_cap, int *port)
{
    const char *host_begin = text, *host_end, *colon;
    if (text[0] == '[') { /* [ipv6]:port */
        host_begin = text + 1;
        host_end = strchr(host_begin, ']');
        if (!host_end || host_end[1] != ':')
            return pt_fail(PIPERT_ERR_CONFIG, "%s='%s': expected [ipv6-address]:port", variable, text);
        colon = host_end + 1;
    } else {
        colon = strrchr(text, ':');
        if (!colon)
            return pt_fail(PIPERT_ERR_CONFIG, "%s='%s': expected host:port", variable, text);
        if (memchr(text, ':', (size_t)(colon - text)))
            return pt_fail(PIPERT_ERR_CONFIG, "%s='%s': write an IPv6 address as [address]:port",
                           variable, text);
        host_end = colon;
    }
    size_t length = (size_t)(host_end - host_begin);
    if (length == 0) return pt_fail(PIPERT_ERR_CONFIG, "%s='%s': the host is empty", variable, text);
    if (length >= host_cap)
        return pt_fail(PIPERT_ERR_CONFIG, "%s='%s': the host name is too long", variable, text);
    long p;
    if (!parse_int(colon + 1, 1, 65535, &p))
        return pt_fail(PIPERT_ERR_CONFIG, "%s='%s': the port must be an integer in [1, 65535]",
                       variable, text);
    memcpy(host, host_begin, length);
    host[length] = '\0';
    *port = (int)p;
    return PIPERT_OK;
}

/* ---- SLURM node lists -------------------------------------------------------- */

typedef struct string_list {
    char **items;
    int count, capacity;
} string_list;

static pipert_result list_push(string_list *list, const char *text, size_t length)
{
    if (list->count >= PT_MAX_WORLD)
        return pt_fail(PIPERT_ERR_CONFIG, "more than %d hosts", PT_MAX_WORLD);
    if (list->count == list->capacity) {
        int capacity = list->capacity ? 2 * list->capacity : 16;
        char **items = realloc(list->items, (size_t)capacity * sizeof *items);
        if (!items) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
        list->items = items;
        list->capacity = capacity;
    }
    char *copy = malloc(length + 1);
    if (!copy) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    memcpy(copy, text, length);
    copy[length] = '\0';
    list->items[list->count++] = copy;
    return PIPERT_OK;
}

/* The end of the item starting at `s`: the first ',' outside brackets, or the
 * end of the string. */
static const char *item_end(const char *s)
{
    int depth = 0;
    for (; *s; s++) {
        if (*s == '[') depth++;
        else if (*s == ']') depth--;
        else if (*s == ',' && depth == 0) break;
    }
    return s;
}

static bool all_digits(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

/* Parses one element of a bracket, "07" or "01-03", into [*first, *last] and
 * the digit count to pad to. */
static pipert_result parse_range(const char *s, size_t n, long *first, long *last, int *width)
{
    const char *dash = memchr(s, '-', n);
    size_t first_len = dash ? (size_t)(dash - s) : n;
    size_t last_len = dash ? n - first_len - 1 : 0;
    if (!all_digits(s, first_len) || (dash && !all_digits(dash + 1, last_len)) || first_len > 9 ||
        last_len > 9)
        return pt_fail(PIPERT_ERR_CONFIG, "'%.*s' is not a number or a range a-b", (int)n, s);
    *first = strtol(s, NULL, 10);
    *last = dash ? strtol(dash + 1, NULL, 10) : *first;
    *width = (int)first_len;
    if (*last < *first)
        return pt_fail(PIPERT_ERR_CONFIG, "range '%.*s' runs backwards", (int)n, s);
    return PIPERT_OK;
}

/* Appends to `out` every name `prefix` + expansion of pattern[0, n): the
 * pattern's first bracket is expanded here, the rest recursively. */
static pipert_result expand_pattern(string_list *out, const char *prefix, const char *pattern,
                                    size_t n)
{
    const char *open = memchr(pattern, '[', n);
    const char *stray = memchr(pattern, ']', open ? (size_t)(open - pattern) : n);
    if (stray) return pt_fail(PIPERT_ERR_CONFIG, "']' without '['");
    char name[PT_HOST_MAX];
    if (!open) {
        int length = snprintf(name, sizeof name, "%s%.*s", prefix, (int)n, pattern);
        if (length <= 0) return pt_fail(PIPERT_ERR_CONFIG, "empty host name");
        if (length >= (int)sizeof name) return pt_fail(PIPERT_ERR_CONFIG, "host name too long");
        return list_push(out, name, (size_t)length);
    }
    const char *close = memchr(open, ']', n - (size_t)(open - pattern));
    if (!close) return pt_fail(PIPERT_ERR_CONFIG, "'[' without ']'");
    if (memchr(open + 1, '[', (size_t)(close - open - 1)))
        return pt_fail(PIPERT_ERR_CONFIG, "nested '['");
    const char *rest = close + 1;
    const size_t rest_len = n - (size_t)(rest - pattern);
    for (const char *element = open + 1; element < close;) {
        const char *comma = memchr(element, ',', (size_t)(close - element));
        const char *element_end = comma ? comma : close;
        long first = 0, last = -1;
        int width = 1;
        PT_TRY(parse_range(element, (size_t)(element_end - element), &first, &last, &width));
        if (last - first >= PT_MAX_WORLD)
            return pt_fail(PIPERT_ERR_CONFIG, "more than %d hosts", PT_MAX_WORLD);
        for (long i = first; i <= last; i++) {
            int length = snprintf(name, sizeof name, "%s%.*s%0*ld", prefix,
                                  (int)(open - pattern), pattern, width, i);
            if (length >= (int)sizeof name) return pt_fail(PIPERT_ERR_CONFIG, "host name too long");
            PT_TRY(expand_pattern(out, name, rest, rest_len));
        }
        element = comma ? comma + 1 : close;
        if (comma && element == close) return pt_fail(PIPERT_ERR_CONFIG, "empty range");
    }
    if (close == open + 1) return pt_fail(PIPERT_ERR_CONFIG, "empty brackets");
    return PIPERT_OK;
}

static pipert_result expand_list(string_list *out, const char *list)
{
    if (!*list) return pt_fail(PIPERT_ERR_CONFIG, "the list is empty");
    for (const char *item = list;;) {
        const char *end = item_end(item);
        if (end == item) return pt_fail(PIPERT_ERR_CONFIG, "empty host name");
        PT_TRY(expand_pattern(out, "", item, (size_t)(end - item)));
        if (!*end) return PIPERT_OK;
        item = end + 1;
    }
}

pipert_result pt_nodelist_expand(const char *list, char ***hosts, int *count)
{
    string_list out = {0};
    pipert_result rc = expand_list(&out, list);
    if (rc != PIPERT_OK) {
        pt_error_prefix("node list '%s'", list);
        pt_nodelist_free(out.items, out.count);
        *hosts = NULL;
        *count = 0;
        return rc;
    }
    *hosts = out.items;
    *count = out.count;
    return PIPERT_OK;
}

void pt_nodelist_free(char **hosts, int count)
{
    for (int i = 0; i < count; i++) free(hosts[i]);
    free(hosts);
}

/* ---- launchers ------------------------------------------------------------- */

const char *pt_launcher_name(pt_launcher_kind kind)
{
    switch (kind) {
    case PT_LAUNCHER_PIPERT: return "pipert launch";
    case PT_LAUNCHER_OPEN_MPI: return "Open MPI";
    case PT_LAUNCHER_SLURM: return "SLURM";
    case PT_LAUNCHER_PMI: return "PMI";
    case PT_LAUNCHER_REPLACEMENT: return "a replacement started apart from the job";
    }
    return "?";
}

/* The variables a launcher names its ranks by; local_* may be NULL (unknown). */
typedef struct rank_variables {
    const char *rank, *size, *local_rank, *local_size;
    bool local_rank_required;
} rank_variables;

static pipert_result read_ranks(pt_bootstrap *b, const char *const *envp, const rank_variables *v)
{
    bool present;
    PT_TRY(env_int(envp, v->rank, 0, INT_MAX, &b->rank, NULL));
    PT_TRY(env_int(envp, v->size, 1, PT_MAX_WORLD, &b->world_size, NULL));
    if (b->rank >= b->world_size)
        return pt_fail(PIPERT_ERR_CONFIG, "%s=%d is not below %s=%d", v->rank, b->rank, v->size,
                       b->world_size);
    b->local_rank = -1;
    if (v->local_rank) {
        PT_TRY(env_int(envp, v->local_rank, 0, INT_MAX, &b->local_rank,
                       v->local_rank_required ? NULL : &present));
        if (b->local_rank > b->rank)
            return pt_fail(PIPERT_ERR_CONFIG,
                           "%s=%d exceeds %s=%d: a worker's index on its host cannot exceed its "
                           "index in the job",
                           v->local_rank, b->local_rank, v->rank, b->rank);
    }
    if (v->local_size) {
        PT_TRY(env_int(envp, v->local_size, 1, PT_MAX_WORLD, &b->local_size, &present));
        if (!present) b->local_size = -1;
        if (present && b->local_size > b->world_size)
            return pt_fail(PIPERT_ERR_CONFIG, "%s=%d exceeds %s=%d", v->local_size, b->local_size,
                           v->size, b->world_size);
        if (present && b->local_rank >= b->local_size)
            return pt_fail(PIPERT_ERR_CONFIG, "%s=%d is not below %s=%d", v->local_rank,
                           b->local_rank, v->local_size, b->local_size);
    }
    return PIPERT_OK;
}

static pipert_result read_coord(pt_bootstrap *b, const char *const *envp, const char *why_needed)
{
    const char *coord = pt_env_lookup(envp, "PIPERT_COORD");
    if (!coord)
        return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_COORD is not set: %s", why_needed);
    return pt_parse_host_port(coord, "PIPERT_COORD", b->coord_host, sizeof b->coord_host,
                              &b->coord_port);
}

static pipert_result from_pipert_launch(pt_bootstrap *b, const char *const *envp)
{
    const rank_variables v = {"PIPERT_RANK", "PIPERT_WORLD_SIZE", "PIPERT_LOCAL_RANK", NULL, true};
    PT_TRY(read_ranks(b, envp, &v));
    return read_coord(b, envp, "pipert launch sets it; is this process a worker of pipert launch?");
}

static pipert_result from_open_mpi(pt_bootstrap *b, const char *const *envp)
{
    const rank_variables v = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                              "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", true};
    PT_TRY(read_ranks(b, envp, &v));
    b->hosts_coordinator = b->rank == 0 && !b->coord_standalone;
    return read_coord(b, envp,
                      "under Open MPI give the coordinator's address, where rank 0 runs: "
                      "mpirun -x PIPERT_COORD=host:port ... (see docs/RUNNING.md)");
}

static pipert_result from_pmi(pt_bootstrap *b, const char *const *envp)
{
    const char *local = pt_env_lookup(envp, "MPI_LOCALRANKID") ? "MPI_LOCALRANKID"
                        : pt_env_lookup(envp, "PMI_LOCAL_RANK") ? "PMI_LOCAL_RANK"
                                                                : NULL;
    const char *local_size = pt_env_lookup(envp, "MPI_LOCALNRANKS") ? "MPI_LOCALNRANKS"
                             : pt_env_lookup(envp, "PMI_LOCAL_SIZE") ? "PMI_LOCAL_SIZE"
                                                                     : NULL;
    const rank_variables v = {"PMI_RANK", "PMI_SIZE", local, local ? local_size : NULL, true};
    PT_TRY(read_ranks(b, envp, &v));
    b->hosts_coordinator = b->rank == 0 && !b->coord_standalone;
    return read_coord(b, envp,
                      "under PMI (MPICH, Intel MPI) give the coordinator's address, where rank 0 "
                      "runs: mpiexec -genv PIPERT_COORD host:port ... (see docs/RUNNING.md)");
}

/* The coordinator under SLURM: PIPERT_COORD if set, else the first node of
 * the step's node list at PIPERT_COORD_PORT or the job's default port. */
static pipert_result slurm_coord(pt_bootstrap *b, const char *const *envp)
{
    if (pt_env_lookup(envp, "PIPERT_COORD")) return read_coord(b, envp, "");
    static const char *const list_variables[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                                 "SLURM_NODELIST"};
    const char *variable = NULL, *list = NULL;
    for (size_t i = 0; i < 3 && !list; i++)
        if ((list = pt_env_lookup(envp, list_variables[i]))) variable = list_variables[i];
    if (!list)
        return pt_fail(PIPERT_ERR_CONFIG, "SLURM_JOB_NODELIST is not set (nor SLURM_STEP_NODELIST): "
                                          "cannot tell where rank 0 runs; set PIPERT_COORD=host:port");
    char **hosts;
    int count;
    if (pt_nodelist_expand(list, &hosts, &count) != PIPERT_OK) {
        pt_error_prefix("%s", variable);
        return PIPERT_ERR_CONFIG;
    }
    snprintf(b->coord_host, sizeof b->coord_host, "%s", hosts[0]);
    pt_nodelist_free(hosts, count);

    bool present;
    PT_TRY(env_int(envp, "PIPERT_COORD_PORT", 1, 65535, &b->coord_port, &present));
    if (present) return PIPERT_OK;
    int job_id = 0;
    PT_TRY(env_int(envp, "SLURM_JOB_ID", 0, INT_MAX, &job_id, &present));
    b->coord_port = PT_SLURM_BASE_PORT + job_id % 1000;
    return PIPERT_OK;
}

static pipert_result from_slurm(pt_bootstrap *b, const char *const *envp)
{
    const rank_variables v = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, true};
    PT_TRY(read_ranks(b, envp, &v));
    b->hosts_coordinator = b->rank == 0 && !b->coord_standalone;
    return slurm_coord(b, envp);
}

/* SLURM's variables describe this process unless an MPI launcher started it
 * inside an allocation (its ranks then disagree with the inherited
 * SLURM_PROCID of the batch step). */
static bool slurm_describes_this_process(const char *const *envp)
{
    const char *procid = pt_env_lookup(envp, "SLURM_PROCID");
    const char *pmi_rank = pt_env_lookup(envp, "PMI_RANK");
    return procid && (!pmi_rank || !strcmp(procid, pmi_rank));
}

static pipert_result read_secret_source(pt_bootstrap *b, const char *const *envp)
{
    const char *secret = pt_env_lookup(envp, "PIPERT_SECRET");
    const char *file = pt_env_lookup(envp, "PIPERT_SECRET_FILE");
    if (secret && file)
        return pt_fail(PIPERT_ERR_CONFIG, "both PIPERT_SECRET and PIPERT_SECRET_FILE are set; set one");
    if (!secret && !file)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "neither PIPERT_SECRET nor PIPERT_SECRET_FILE is set: every worker of a job "
                       "needs the job's secret (e.g. export PIPERT_SECRET=$(openssl rand -hex 32))");
    if (file) {
        if (!*file || strlen(file) >= sizeof b->secret_file)
            return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_SECRET_FILE: empty or too long a path");
        strcpy(b->secret_file, file);
        return PIPERT_OK;
    }
    size_t length = strlen(secret);
    if (length < PT_SECRET_MIN || length > PT_SECRET_MAX)
        return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_SECRET: %zu characters; use %d to %d", length,
                       PT_SECRET_MIN, PT_SECRET_MAX);
    for (size_t i = 0; i < length; i++)
        if (secret[i] <= ' ' || secret[i] > '~')
            return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_SECRET: only printable characters without "
                                              "spaces (hex digits are best)");
    strcpy(b->secret, secret);
    return PIPERT_OK;
}

static pipert_result read_cores(pt_bootstrap *b, const char *const *envp)
{
    const char *cores = pt_env_lookup(envp, "PIPERT_CORES");
    if (!cores) return PIPERT_OK;
    char first[16] = "", count[16] = "";
    const char *comma = strchr(cores, ',');
    long f, c;
    if (comma && (size_t)(comma - cores) < sizeof first && strlen(comma + 1) < sizeof count) {
        memcpy(first, cores, (size_t)(comma - cores));
        strcpy(count, comma + 1);
    }
    if (!parse_int(first, 0, INT_MAX, &f) || !parse_int(count, 1, INT_MAX, &c))
        return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_CORES='%s': expected FIRST,COUNT (count ≥ 1)",
                       cores);
    b->cores_first = (int)f;
    b->cores_count = (int)c;
    return PIPERT_OK;
}

static pipert_result read_site(pt_bootstrap *b, const char *const *envp)
{
    const char *site = pt_env_lookup(envp, "PIPERT_SITE");
    long value = 0;
    if (site && !parse_int(site, 0, PT_MAX_WORLD - 1, &value))
        return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_SITE='%s': expected a site number in [0, %d)", site,
                       PT_MAX_WORLD);
    b->site = (int)value;
    return PIPERT_OK;
}

/* Seconds in [1, 3600] from `name` (0 when unset). */
static pipert_result read_seconds(const char *const *envp, const char *name, double *seconds)
{
    const char *text = pt_env_lookup(envp, name);
    *seconds = 0;
    if (!text) return PIPERT_OK;
    char *end;
    double value = strtod(text, &end);
    if (end == text || *end || !(value >= 1 && value <= 3600))
        return pt_fail(PIPERT_ERR_CONFIG, "%s='%s': expected seconds in [1, 3600]", name, text);
    *seconds = value;
    return PIPERT_OK;
}

/* PIPERT_COORD_STANDALONE=1: the coordinator is `pipert coordinator --listen`, a process of
 * its own (started again when it dies), not rank 0's. */
static pipert_result read_standalone(pt_bootstrap *b, const char *const *envp)
{
    const char *text = pt_env_lookup(envp, "PIPERT_COORD_STANDALONE");
    if (text && strcmp(text, "0") && strcmp(text, "1"))
        return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_COORD_STANDALONE='%s': expected 1 (the "
                                          "coordinator is pipert coordinator --listen) or 0", text);
    b->coord_standalone = text && !strcmp(text, "1");
    return PIPERT_OK;
}

static pipert_result read_heartbeat_timeout(pt_bootstrap *b, const char *const *envp)
{
    PT_TRY(read_seconds(envp, "PIPERT_HEARTBEAT_TIMEOUT", &b->heartbeat_timeout_s));
    PT_TRY(read_seconds(envp, "PIPERT_COORD_RECONNECT", &b->coord_reconnect_s));
    /* a standalone coordinator that dies is started again on the same socket: register again */
    if (b->coord_standalone && b->coord_reconnect_s == 0)
        b->coord_reconnect_s = fmax(PT_STANDALONE_RECONNECT_S, 2 * b->heartbeat_timeout_s);
    return PIPERT_OK;
}

pipert_result pt_bootstrap_from_env(pt_bootstrap *b, const char *const *envp)
{
    memset(b, 0, sizeof *b);
    b->local_size = -1;
    PT_TRY(read_standalone(b, envp));
    if (pt_env_lookup(envp, "PIPERT_RANK")) {
        b->launcher = PT_LAUNCHER_PIPERT;
        PT_TRY(from_pipert_launch(b, envp));
    } else if (pt_env_lookup(envp, "OMPI_COMM_WORLD_RANK")) {
        b->launcher = PT_LAUNCHER_OPEN_MPI;
        PT_TRY(from_open_mpi(b, envp));
    } else if (slurm_describes_this_process(envp)) {
        b->launcher = PT_LAUNCHER_SLURM;
        PT_TRY(from_slurm(b, envp));
    } else if (pt_env_lookup(envp, "PMI_RANK")) {
        b->launcher = PT_LAUNCHER_PMI;
        PT_TRY(from_pmi(b, envp));
    } else {
        return pt_fail(PIPERT_ERR_CONFIG,
                       "no launcher found: none of PIPERT_RANK (pipert launch), "
                       "OMPI_COMM_WORLD_RANK (Open MPI), SLURM_PROCID (srun), PMI_RANK (MPICH) is "
                       "set; start workers with pipert launch, srun or mpirun (docs/RUNNING.md)");
    }
    PT_TRY(read_secret_source(b, envp));
    PT_TRY(read_cores(b, envp));
    PT_TRY(read_heartbeat_timeout(b, envp));
    return read_site(b, envp);
}

/* The local rank of a replacement: PIPERT_LOCAL_RANK, else its launcher's, else 0. */
static pipert_result replacement_local_rank(pt_bootstrap *b, const char *const *envp)
{
    static const char *const variables[] = {"PIPERT_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                            "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"};
    for (size_t i = 0; i < sizeof variables / sizeof variables[0]; i++) {
        bool present;
        PT_TRY(env_int(envp, variables[i], 0, PT_MAX_WORLD, &b->local_rank, &present));
        if (present) return PIPERT_OK;
    }
    b->local_rank = 0;
    return PIPERT_OK;
}

pipert_result pt_bootstrap_replacement(pt_bootstrap *b, const char *const *envp, int rank,
                                       int world)
{
    memset(b, 0, sizeof *b);
    PT_TRY(read_standalone(b, envp));
    const int lowest = b->coord_standalone ? 0 : 1;
    if (world < 2 || world > PT_MAX_WORLD || rank < lowest || rank >= world)
        return pt_fail(PIPERT_ERR_CONFIG, "a replacement for rank %d of a job of %d ranks: it "
                                          "must take a rank in %d..%d%s", rank, world, lowest,
                       world - 1, lowest ? " (rank 0 hosts the coordinator; with a standalone "
                                           "one, PIPERT_COORD_STANDALONE=1, it may be replaced)"
                                         : "");
    b->launcher = PT_LAUNCHER_REPLACEMENT;
    b->rank = rank;
    b->world_size = world;
    b->local_size = -1;
    PT_TRY(replacement_local_rank(b, envp));
    PT_TRY(read_coord(b, envp, "a replacement reaches the running job's coordinator there (rank "
                               "0's log names its address)"));
    PT_TRY(read_secret_source(b, envp));
    PT_TRY(read_cores(b, envp));
    PT_TRY(read_heartbeat_timeout(b, envp));
    return read_site(b, envp);
}

/* ---- the secret ------------------------------------------------------------ */

static bool secret_is_well_formed(const char *secret)
{
    size_t length = strlen(secret);
    if (length < PT_SECRET_MIN || length > PT_SECRET_MAX) return false;
    for (size_t i = 0; i < length; i++)
        if (secret[i] <= ' ' || secret[i] > '~') return false;
    return true;
}

static pipert_result read_secret_file(const char *path, char *secret)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pt_fail(PIPERT_ERR_IO, "PIPERT_SECRET_FILE %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    char text[PT_SECRET_MAX + 3];
    ssize_t n = -1;
    pipert_result rc = PIPERT_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = pt_fail(PIPERT_ERR_IO, "PIPERT_SECRET_FILE %s: not a regular file", path);
    else if (st.st_mode & 077)
        rc = pt_fail(PIPERT_ERR_AUTH, "PIPERT_SECRET_FILE %s: readable by others (mode %04o); "
                                      "chmod 600 it",
                     path, (unsigned)(st.st_mode & 07777));
    else if ((n = read(fd, text, sizeof text - 1)) < 0)
        rc = pt_fail(PIPERT_ERR_IO, "PIPERT_SECRET_FILE %s: cannot read: %s", path, strerror(errno));
    close(fd);
    PT_TRY(rc);
    text[n] = '\0';
    text[strcspn(text, "\r\n")] = '\0';
    if (!secret_is_well_formed(text))
        return pt_fail(PIPERT_ERR_AUTH, "PIPERT_SECRET_FILE %s: the first line must hold %d to %d "
                                        "printable characters without spaces",
                       path, PT_SECRET_MIN, PT_SECRET_MAX);
    strcpy(secret, text);
    return PIPERT_OK;
}

pipert_result pt_bootstrap_read_secret(const pt_bootstrap *b, char *secret)
{
    if (b->secret_file[0]) return read_secret_file(b->secret_file, secret);
    if (!secret_is_well_formed(b->secret))
        return pt_fail(PIPERT_ERR_AUTH, "no job secret (PIPERT_SECRET or PIPERT_SECRET_FILE)");
    strcpy(secret, b->secret);
    return PIPERT_OK;
}

pipert_result pt_secret_generate(char *hex)
{
    unsigned char bytes[PT_SECRET_BYTES];
    size_t have = 0;
    while (have < sizeof bytes) {
        ssize_t n = getrandom(bytes + have, sizeof bytes - have, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return pt_fail(PIPERT_ERR_IO, "getrandom: %s", strerror(errno));
        have += (size_t)n;
    }
    for (size_t i = 0; i < sizeof bytes; i++) sprintf(hex + 2 * i, "%02x", bytes[i]);
    return PIPERT_OK;
}

pipert_result pt_secret_write_file(const char *path, const char *secret)
{
    if (unlink(path) != 0 && errno != ENOENT)
        return pt_fail(PIPERT_ERR_IO, "%s: cannot replace: %s", path, strerror(errno));
    /* O_EXCL: nobody can have slipped a file (or link) with other permissions in. */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return pt_fail(PIPERT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t length = strlen(secret);
    bool ok = fchmod(fd, 0600) == 0 && write(fd, secret, length) == (ssize_t)length &&
              write(fd, "\n", 1) == 1;
    int saved = errno;
    ok = close(fd) == 0 && ok;
    if (!ok) {
        unlink(path);
        return pt_fail(PIPERT_ERR_IO, "%s: cannot write: %s", path, strerror(saved));
    }
    return PIPERT_OK;
}

bool pt_secret_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)(a[i] ^ (i < lb ? b[i] : 0));
    return diff == 0;
}
