/* Bootstrap: how a worker process learns who it is in a job — its rank, the
 * world size, its rank on this host, where the coordinator listens, and the
 * job's secret — from the environment its launcher gave it.
 *
 * Launchers, tried in this order (the first whose rank variable is set wins):
 *
 *   pipert launch  PIPERT_RANK, PIPERT_WORLD_SIZE, PIPERT_LOCAL_RANK,
 *                  PIPERT_COORD=host:port, PIPERT_SECRET_FILE (all required).
 *                  The coordinator runs in the launcher.
 *   Open MPI       OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
 *                  OMPI_COMM_WORLD_LOCAL_RANK (OMPI_COMM_WORLD_LOCAL_SIZE if
 *                  set); PIPERT_COORD=host:port is required.
 *   SLURM          SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the node list
 *                  SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, else
 *                  SLURM_NODELIST). The coordinator listens on the first node
 *                  of the list (where srun puts rank 0), on port
 *                  PIPERT_COORD_PORT, or by default
 *                  PT_SLURM_BASE_PORT + SLURM_JOB_ID mod 1000;
 *                  PIPERT_COORD=host:port overrides both. Skipped when
 *                  PMI_RANK is set and differs from SLURM_PROCID: that is an
 *                  MPI launcher (mpiexec) run inside an allocation, whose
 *                  processes inherit the batch step's SLURM_PROCID.
 *   PMI            PMI_RANK, PMI_SIZE (MPICH, Intel MPI); local rank from
 *                  MPI_LOCALRANKID or PMI_LOCAL_RANK when set;
 *                  PIPERT_COORD=host:port is required.
 *
 * Under SLURM, Open MPI and PMI the coordinator runs inside rank 0's process,
 * listening on every interface at the port of its address.
 *
 * The job secret (every worker must present it to the coordinator) comes from
 * PIPERT_SECRET_FILE (a file of mode 0600 holding it) or PIPERT_SECRET (the
 * value itself); exactly one must be set. `pipert launch` writes the file.
 *
 * PIPERT_CORES=first,count (optional, any launcher) binds the worker to those
 * cores (indices among the cores it may run on, see runtime/topology.h).
 *
 * PIPERT_SITE=N (optional, any launcher; default 0) says which site the
 * worker is in: sites are joined by slow links, and only the coupling
 * method's traffic crosses them (session/job.h).
 *
 * PIPERT_HEARTBEAT_TIMEOUT=S (optional, any launcher; default 5) is how long a
 * silent peer of the control path (a worker for the coordinator, the
 * coordinator for a worker) is given before the job is aborted: longer where
 * links may drop for a while (pipert launch sets 30 between emulated sites).
 *
 * PIPERT_COORD_RECONNECT=S (optional; pipert launch sets it, as it starts a
 * coordinator again when one dies) is how long a worker whose coordinator
 * connection closed tries to register again before the coordinator is lost.
 *
 * Everything here is a pure function of an environment array
 * ("NAME=value" strings, NULL-terminated, like `environ`), except
 * pt_bootstrap_read_secret and the secret-file helpers, which touch files.
 */
#ifndef PT_BOOTSTRAP_H
#define PT_BOOTSTRAP_H

#include <stdbool.h>
#include <stddef.h>

#include "comm/layout.h" /* pt_rank_layout, for this header's callers */
#include "runtime/error.h"

#define PT_HOST_MAX 256          /* host names, with their NUL */
#define PT_SECRET_MAX 128        /* longest accepted secret, in characters */
#define PT_SECRET_MIN 16         /* shortest accepted secret */
#define PT_SECRET_BYTES 32       /* random bytes in a generated secret (64 hex digits) */
#define PT_SLURM_BASE_PORT 29500 /* default coordinator port under SLURM, plus job id mod 1000 */
/* With PIPERT_COORD_STANDALONE=1 and no PIPERT_COORD_RECONNECT, a worker whose coordinator
 * connection closed registers again for this long (at least twice the heartbeat timeout). */
#define PT_STANDALONE_RECONNECT_S 30.0
#define PT_MAX_WORLD 65536       /* ranks in a job */

typedef enum pt_launcher_kind {
    PT_LAUNCHER_PIPERT,
    PT_LAUNCHER_OPEN_MPI,
    PT_LAUNCHER_SLURM,
    PT_LAUNCHER_PMI,
    PT_LAUNCHER_REPLACEMENT, /* a process started apart from the job to take a rank of it */
} pt_launcher_kind;

typedef struct pt_bootstrap {
    pt_launcher_kind launcher;
    int rank;                      /* [0, world_size) */
    int world_size;                /* ≥ 1 */
    int local_rank;                /* among this host's workers; -1 unknown (PMI only) */
    int local_size;                /* workers on this host; -1 unknown */
    char coord_host[PT_HOST_MAX];  /* where the coordinator listens */
    int coord_port;                /* [1, 65535] */
    bool hosts_coordinator;        /* this process runs the coordinator (rank 0, not under pipert
                                      launch nor with a standalone one) */
    bool coord_standalone;         /* PIPERT_COORD_STANDALONE=1: pipert coordinator --listen */
    char secret[PT_SECRET_MAX + 1]; /* PIPERT_SECRET, or "" */
    char secret_file[4096];        /* PIPERT_SECRET_FILE, or "" */
    int cores_first, cores_count;  /* PIPERT_CORES; cores_count 0 when unset */
    int site;                      /* PIPERT_SITE; 0 when unset */
    double heartbeat_timeout_s;    /* PIPERT_HEARTBEAT_TIMEOUT; 0 when unset (the default) */
    double coord_reconnect_s;      /* PIPERT_COORD_RECONNECT; 0 when unset */
} pt_bootstrap;

/* Fills *b from envp. Fails with PIPERT_ERR_CONFIG and a message naming the
 * variable when no launcher is recognised, a required variable is missing, a
 * value is not a number, or values are inconsistent (rank ≥ world size, ...). */
pipert_result pt_bootstrap_from_env(pt_bootstrap *b, const char *const *envp);

/* A replacement for `rank` of a running job of `world` ranks whose coordinator runs in rank 0
 * (SLURM, Open MPI, PMI) or on its own (PIPERT_COORD_STANDALONE=1), started apart from it
 * (pipert worker --join --rank R --world W: by hand, or by another srun or mpirun).
 * PIPERT_COORD gives the coordinator (required), the secret and the optional variables as
 * above; the local rank is PIPERT_LOCAL_RANK, else what a launcher's variables say, else 0.
 * Rank 0 can be replaced only with a standalone coordinator (else it hosts it). */
pipert_result pt_bootstrap_replacement(pt_bootstrap *b, const char *const *envp, int rank,
                                       int world);

/* "pipert launch", "Open MPI", "SLURM", "PMI", "a replacement". */
const char *pt_launcher_name(pt_launcher_kind kind);

/* The value of NAME in envp, or NULL. */
const char *pt_env_lookup(const char *const *envp, const char *name);

/* Splits "host:port" or "[ipv6]:port" (the value of `variable`, named in
 * errors) into host (capacity host_cap) and port ∈ [1, 65535]. */
pipert_result pt_parse_host_port(const char *text, const char *variable, char *host,
                                 size_t host_cap, int *port);

/* Expands a SLURM node list ("node[01-03,07],gpu5", "rack[1-2]-n[1-2]") into
 * host names, in order, zero padding kept ("node01"). *hosts is a malloc'd
 * array of *count malloc'd strings; free with pt_nodelist_free. Malformed
 * lists (unbalanced brackets, a range that runs backwards, an empty name) are
 * PIPERT_ERR_CONFIG naming the list; lists of more than PT_MAX_WORLD hosts
 * are refused. */
pipert_result pt_nodelist_expand(const char *list, char ***hosts, int *count);
void pt_nodelist_free(char **hosts, int count);

/* The job secret of b: PIPERT_SECRET's value, or the first line of
 * PIPERT_SECRET_FILE (which must not be readable by group or others).
 * secret has capacity PT_SECRET_MAX + 1. */
pipert_result pt_bootstrap_read_secret(const pt_bootstrap *b, char *secret);

/* A fresh secret: PT_SECRET_BYTES bytes from getrandom(2) as lowercase hex,
 * NUL-terminated (hex has 2·PT_SECRET_BYTES + 1 bytes). */
pipert_result pt_secret_generate(char *hex);

/* Writes `secret` and a newline to a new file at `path` created with mode
 * 0600 (an existing file is replaced). */
pipert_result pt_secret_write_file(const char *path, const char *secret);

/* Compares two secrets in time independent of where they differ. */
bool pt_secret_equal(const char *a, const char *b);

#endif
