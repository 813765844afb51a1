/* Bootstrap: rank, world, local rank, coordinator and secret from the
 * environments pipert launch, SLURM, Open MPI and PMI give a worker; SLURM
 * node lists; the rank layout; the job secret. Expected values are written
 * out by hand; every error must name the variable at fault. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "comm/layout.h"

#define SECRET "0123456789abcdef0123456789abcdef"

/* Runs pt_bootstrap_from_env on a NULL-terminated list of "NAME=value". */
static pipert_result bootstrap(pt_bootstrap *b, const char *const *env)
{
    return pt_bootstrap_from_env(b, env);
}

/* Expects a failure whose message contains every one of the NULL-terminated
 * fragments. */
static void expect_error(const char *const *env, const char *const *fragments)
{
    pt_bootstrap b;
    pipert_result rc = bootstrap(&b, env);
    cr_assert_eq(rc, PIPERT_ERR_CONFIG, "expected a configuration error, got %s (%s)",
                 pipert_result_str(rc), pipert_last_error());
    for (const char *const *f = fragments; *f; f++)
        cr_expect(strstr(pipert_last_error(), *f), "error '%s' does not mention '%s'",
                  pipert_last_error(), *f);
}

#define ENV(...) ((const char *const[]){__VA_ARGS__, NULL})
#define MENTIONS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- pipert launch --------------------------------------------------------- */

Test(bootstrap, pipert_launch)
{
    pt_bootstrap b;
    cr_assert_eq(bootstrap(&b, ENV("HOME=/root", "PIPERT_RANK=2", "PIPERT_WORLD_SIZE=4",
                                   "PIPERT_LOCAL_RANK=2", "PIPERT_COORD=127.0.0.1:40001",
                                   "PIPERT_SECRET_FILE=/tmp/job.secret", "PIPERT_CORES=3,1")),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.launcher, PT_LAUNCHER_PIPERT);
    cr_expect_eq(b.rank, 2);
    cr_expect_eq(b.world_size, 4);
    cr_expect_eq(b.local_rank, 2);
    cr_expect_eq(b.local_size, -1);
    cr_expect_str_eq(b.coord_host, "127.0.0.1");
    cr_expect_eq(b.coord_port, 40001);
    cr_expect_not(b.hosts_coordinator, "under pipert launch the launcher runs the coordinator");
    cr_expect_str_eq(b.secret_file, "/tmp/job.secret");
    cr_expect_str_eq(b.secret, "");
    cr_expect_eq(b.cores_first, 3);
    cr_expect_eq(b.cores_count, 1);
}

Test(bootstrap, pipert_launch_errors_name_the_variable)
{
    expect_error(ENV("PIPERT_RANK=0", "PIPERT_LOCAL_RANK=0", "PIPERT_COORD=h:1",
                     "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_WORLD_SIZE", "not set"));
    expect_error(ENV("PIPERT_RANK=4", "PIPERT_WORLD_SIZE=4", "PIPERT_LOCAL_RANK=0",
                     "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_RANK=4", "PIPERT_WORLD_SIZE=4"));
    expect_error(ENV("PIPERT_RANK=x1", "PIPERT_WORLD_SIZE=4", "PIPERT_LOCAL_RANK=0",
                     "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_RANK", "x1"));
    expect_error(ENV("PIPERT_RANK=-1", "PIPERT_WORLD_SIZE=4", "PIPERT_LOCAL_RANK=0",
                     "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_RANK", "-1"));
    expect_error(ENV("PIPERT_RANK=1", "PIPERT_WORLD_SIZE=0", "PIPERT_LOCAL_RANK=0",
                     "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_WORLD_SIZE", "0"));
    expect_error(ENV("PIPERT_RANK=1", "PIPERT_WORLD_SIZE=4", "PIPERT_LOCAL_RANK=3",
                     "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_LOCAL_RANK=3", "PIPERT_RANK=1"));
    expect_error(ENV("PIPERT_RANK=1", "PIPERT_WORLD_SIZE=4", "PIPERT_LOCAL_RANK=1",
                     "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_COORD", "not set"));
    expect_error(ENV("PIPERT_RANK=1", "PIPERT_WORLD_SIZE=4", "PIPERT_LOCAL_RANK=1",
                     "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET, "PIPERT_CORES=2"),
                 MENTIONS("PIPERT_CORES", "FIRST,COUNT"));
    expect_error(ENV("PIPERT_RANK=1", "PIPERT_WORLD_SIZE=4", "PIPERT_LOCAL_RANK=1",
                     "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET, "PIPERT_CORES=2,0"),
                 MENTIONS("PIPERT_CORES"));
}

Test(bootstrap, coordinator_address)
{
    char host[PT_HOST_MAX];
    int port = 0;
    cr_assert_eq(pt_parse_host_port("node07:29501", "V", host, sizeof host, &port), PIPERT_OK);
    cr_expect_str_eq(host, "node07");
    cr_expect_eq(port, 29501);
    cr_assert_eq(pt_parse_host_port("[fe80::1]:65535", "V", host, sizeof host, &port), PIPERT_OK,
                 "%s", pipert_last_error());
    cr_expect_str_eq(host, "fe80::1");
    cr_expect_eq(port, 65535);
    static const char *const bad[] = {"node07", "node07:", ":29500", "node07:0", "node07:65536",
                                      "node07:12x", "fe80::1:29500", "[fe80::1]29500", "h: 5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(pt_parse_host_port(bad[i], "PIPERT_COORD", host, sizeof host, &port),
                     PIPERT_ERR_CONFIG, "'%s' was accepted", bad[i]);
        cr_expect(strstr(pipert_last_error(), "PIPERT_COORD") && strstr(pipert_last_error(), bad[i]),
                  "error for '%s' does not name the variable and value: %s", bad[i],
                  pipert_last_error());
    }
}

Test(bootstrap, secret_sources)
{
    expect_error(ENV("PIPERT_RANK=0", "PIPERT_WORLD_SIZE=1", "PIPERT_LOCAL_RANK=0", "PIPERT_COORD=h:1"),
                 MENTIONS("PIPERT_SECRET", "PIPERT_SECRET_FILE"));
    expect_error(ENV("PIPERT_RANK=0", "PIPERT_WORLD_SIZE=1", "PIPERT_LOCAL_RANK=0", "PIPERT_COORD=h:1",
                     "PIPERT_SECRET=" SECRET, "PIPERT_SECRET_FILE=/x"),
                 MENTIONS("both"));
    expect_error(ENV("PIPERT_RANK=0", "PIPERT_WORLD_SIZE=1", "PIPERT_LOCAL_RANK=0", "PIPERT_COORD=h:1",
                     "PIPERT_SECRET=short"),
                 MENTIONS("PIPERT_SECRET", "5 characters"));
    pt_bootstrap b;
    cr_assert_eq(bootstrap(&b, ENV("PIPERT_RANK=0", "PIPERT_WORLD_SIZE=1", "PIPERT_LOCAL_RANK=0",
                                   "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    char secret[PT_SECRET_MAX + 1];
    cr_assert_eq(pt_bootstrap_read_secret(&b, secret), PIPERT_OK);
    cr_expect_str_eq(secret, SECRET);
}

/* ---- SLURM ------------------------------------------------------------------ */

Test(bootstrap, slurm_first_node_and_default_port)
{
    pt_bootstrap b;
    cr_assert_eq(bootstrap(&b, ENV("SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1",
                                   "SLURM_JOB_NODELIST=node[01-03,07],gpu5", "SLURM_JOB_ID=123456",
                                   "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.launcher, PT_LAUNCHER_SLURM);
    cr_expect_eq(b.rank, 5);
    cr_expect_eq(b.world_size, 8);
    cr_expect_eq(b.local_rank, 1);
    cr_expect_str_eq(b.coord_host, "node01");
    cr_expect_eq(b.coord_port, 29500 + 456, "port %d, expected 29500 + 123456 mod 1000", b.coord_port);
    cr_expect_not(b.hosts_coordinator);

    cr_assert_eq(bootstrap(&b, ENV("SLURM_PROCID=0", "SLURM_NTASKS=8", "SLURM_LOCALID=0",
                                   "SLURM_JOB_NODELIST=a[1-4]", "SLURM_STEP_NODELIST=b[3-4]",
                                   "PIPERT_COORD_PORT=31000", "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_str_eq(b.coord_host, "b3", "the step's node list comes first");
    cr_expect_eq(b.coord_port, 31000);
    cr_expect(b.hosts_coordinator, "rank 0 runs the coordinator under SLURM");

    cr_assert_eq(bootstrap(&b, ENV("SLURM_PROCID=3", "SLURM_NTASKS=8", "SLURM_LOCALID=3",
                                   "SLURM_JOB_NODELIST=a[1-4]", "PIPERT_COORD=login2:7000",
                                   "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_str_eq(b.coord_host, "login2", "PIPERT_COORD overrides the node list");
    cr_expect_eq(b.coord_port, 7000);

    cr_assert_eq(bootstrap(&b, ENV("SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0",
                                   "SLURM_NODELIST=solo", "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_str_eq(b.coord_host, "solo");
    cr_expect_eq(b.coord_port, 29500, "no SLURM_JOB_ID: the base port");
}

Test(bootstrap, slurm_errors_name_the_variable)
{
    expect_error(ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=n1",
                     "PIPERT_SECRET=" SECRET),
                 MENTIONS("SLURM_LOCALID"));
    expect_error(ENV("SLURM_PROCID=2", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                     "SLURM_JOB_NODELIST=n1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("SLURM_PROCID=2", "SLURM_NTASKS=2"));
    expect_error(ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "PIPERT_SECRET=" SECRET),
                 MENTIONS("SLURM_JOB_NODELIST", "PIPERT_COORD"));
    expect_error(ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                     "SLURM_JOB_NODELIST=n[2-1]", "PIPERT_SECRET=" SECRET),
                 MENTIONS("SLURM_JOB_NODELIST", "n[2-1]", "backwards"));
    expect_error(ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                     "SLURM_JOB_NODELIST=n1", "PIPERT_COORD_PORT=99999", "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_COORD_PORT"));
    expect_error(ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_JOB_NODELIST=n1"),
                 MENTIONS("PIPERT_SECRET"));
}

/* mpiexec inside an allocation: the batch step's SLURM_PROCID is inherited
 * by every process, PMI_RANK is the truth. */
Test(bootstrap, mpi_inside_slurm_allocation)
{
    pt_bootstrap b;
    cr_assert_eq(bootstrap(&b, ENV("SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0",
                                   "SLURM_JOB_NODELIST=n[1-2]", "PMI_RANK=3", "PMI_SIZE=4",
                                   "PIPERT_COORD=n1:29999", "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.launcher, PT_LAUNCHER_PMI);
    cr_expect_eq(b.rank, 3);
    cr_expect_eq(b.world_size, 4);
    /* srun --mpi=pmi2 sets both, equal: SLURM's own variables apply. */
    cr_assert_eq(bootstrap(&b, ENV("SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=1",
                                   "SLURM_JOB_NODELIST=n[1-2]", "PMI_RANK=3", "PMI_SIZE=4",
                                   "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.launcher, PT_LAUNCHER_SLURM);
    cr_expect_str_eq(b.coord_host, "n1");
    /* Open MPI's variables beat an inherited SLURM_PROCID too. */
    cr_assert_eq(bootstrap(&b, ENV("SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0",
                                   "SLURM_JOB_NODELIST=n1", "OMPI_COMM_WORLD_RANK=6",
                                   "OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_LOCAL_RANK=2",
                                   "PIPERT_COORD=n1:29999", "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.launcher, PT_LAUNCHER_OPEN_MPI);
    cr_expect_eq(b.rank, 6);
}

/* ---- Open MPI and PMI -------------------------------------------------------- */

Test(bootstrap, open_mpi)
{
    pt_bootstrap b;
    cr_assert_eq(bootstrap(&b, ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=8",
                                   "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
                                   "PIPERT_COORD=[::1]:29500", "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.launcher, PT_LAUNCHER_OPEN_MPI);
    cr_expect_eq(b.world_size, 8);
    cr_expect_eq(b.local_size, 4);
    cr_expect_str_eq(b.coord_host, "::1");
    cr_expect(b.hosts_coordinator);

    expect_error(ENV("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=8",
                     "OMPI_COMM_WORLD_LOCAL_RANK=1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_COORD", "not set", "mpirun -x PIPERT_COORD"));
    expect_error(ENV("OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8",
                     "OMPI_COMM_WORLD_LOCAL_RANK=4", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
                     "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("OMPI_COMM_WORLD_LOCAL_RANK=4", "OMPI_COMM_WORLD_LOCAL_SIZE=4"));
    expect_error(ENV("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=8",
                     "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=9",
                     "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("OMPI_COMM_WORLD_LOCAL_SIZE=9", "OMPI_COMM_WORLD_SIZE=8"));
}

/* ---- a replacement started apart from the job (pipert worker --join --rank --world) ---- */

Test(bootstrap, a_replacement_takes_the_rank_it_is_given)
{
    pt_bootstrap b;
    /* started by another mpirun of one process: its rank and size are not the job's */
    cr_assert_eq(pt_bootstrap_replacement(&b, ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1",
                                                  "OMPI_COMM_WORLD_LOCAL_RANK=0",
                                                  "PIPERT_COORD=a:29500", "PIPERT_SECRET=" SECRET),
                                          3, 6),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.launcher, PT_LAUNCHER_REPLACEMENT);
    cr_expect_eq(b.rank, 3);
    cr_expect_eq(b.world_size, 6);
    cr_expect_eq(b.local_rank, 0);
    cr_expect_str_eq(b.coord_host, "a");
    cr_expect_eq(b.coord_port, 29500);
    cr_expect(!b.hosts_coordinator, "rank 0 of the job hosts it, not a replacement");
    /* by hand: PIPERT_LOCAL_RANK first, else a launcher's, else 0 */
    cr_assert_eq(pt_bootstrap_replacement(&b, ENV("PIPERT_LOCAL_RANK=2", "SLURM_LOCALID=1",
                                                  "PIPERT_COORD=a:1", "PIPERT_SECRET=" SECRET),
                                          5, 6),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.local_rank, 2);
    cr_assert_eq(pt_bootstrap_replacement(&b, ENV("SLURM_LOCALID=1", "PIPERT_COORD=a:1",
                                                  "PIPERT_SECRET=" SECRET),
                                          5, 6),
                 PIPERT_OK);
    cr_expect_eq(b.local_rank, 1);
    cr_assert_eq(pt_bootstrap_replacement(&b, ENV("PIPERT_COORD=a:1", "PIPERT_SECRET=" SECRET), 1, 2),
                 PIPERT_OK);
    cr_expect_eq(b.local_rank, 0);

    cr_expect_eq(pt_bootstrap_replacement(&b, ENV("PIPERT_COORD=a:1", "PIPERT_SECRET=" SECRET), 0, 6),
                 PIPERT_ERR_CONFIG, "rank 0 hosts the coordinator");
    cr_expect(strstr(pipert_last_error(), "rank 0 hosts the coordinator"), "%s", pipert_last_error());
    /* with a standalone coordinator rank 0 is a worker like the others, and may be replaced */
    cr_assert_eq(pt_bootstrap_replacement(&b, ENV("PIPERT_COORD=a:1", "PIPERT_SECRET=" SECRET,
                                                  "PIPERT_COORD_STANDALONE=1"),
                                          0, 6),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect(b.coord_standalone && !b.hosts_coordinator && b.rank == 0);
    cr_expect_eq(b.coord_reconnect_s, PT_STANDALONE_RECONNECT_S, "it registers again for 30 s");
    cr_expect_eq(pt_bootstrap_replacement(&b, ENV("PIPERT_COORD=a:1", "PIPERT_SECRET=" SECRET), 6, 6),
                 PIPERT_ERR_CONFIG);
    cr_expect_eq(pt_bootstrap_replacement(&b, ENV("PIPERT_SECRET=" SECRET), 3, 6), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "PIPERT_COORD is not set"), "%s", pipert_last_error());
    cr_expect_eq(pt_bootstrap_replacement(&b, ENV("PIPERT_COORD=a:1", "PIPERT_LOCAL_RANK=x",
                                                  "PIPERT_SECRET=" SECRET),
                                          3, 6),
                 PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "PIPERT_LOCAL_RANK"), "%s", pipert_last_error());
}

/* PIPERT_COORD_STANDALONE=1: rank 0 does not host the coordinator; the workers register again
 * with it when it is started again (twice the heartbeat timeout, at least 30 s, unless
 * PIPERT_COORD_RECONNECT says); anything but 0 or 1 is named. */
Test(bootstrap, a_standalone_coordinator)
{
    pt_bootstrap b;
    cr_assert_eq(bootstrap(&b, ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4",
                                   "OMPI_COMM_WORLD_LOCAL_RANK=0", "PIPERT_COORD=h:7", "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect(b.hosts_coordinator && !b.coord_standalone && b.coord_reconnect_s == 0);
    cr_assert_eq(bootstrap(&b, ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4",
                                   "OMPI_COMM_WORLD_LOCAL_RANK=0", "PIPERT_COORD=h:7", "PIPERT_SECRET=" SECRET,
                                   "PIPERT_COORD_STANDALONE=1", "PIPERT_HEARTBEAT_TIMEOUT=20")),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect(!b.hosts_coordinator && b.coord_standalone);
    cr_expect_eq(b.coord_reconnect_s, 40.0, "twice the heartbeat timeout");
    cr_assert_eq(bootstrap(&b, ENV("SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                                   "SLURM_JOB_NODELIST=n1", "PIPERT_SECRET=" SECRET,
                                   "PIPERT_COORD_STANDALONE=1", "PIPERT_COORD_RECONNECT=9")),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect(!b.hosts_coordinator);
    cr_expect_eq(b.coord_reconnect_s, 9.0);
    cr_expect_eq(bootstrap(&b, ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4",
                                   "OMPI_COMM_WORLD_LOCAL_RANK=0", "PIPERT_COORD=h:7", "PIPERT_SECRET=" SECRET,
                                   "PIPERT_COORD_STANDALONE=yes")),
                 PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "PIPERT_COORD_STANDALONE='yes'"), "%s",
              pipert_last_error());
}

Test(bootstrap, pmi)
{
    pt_bootstrap b;
    cr_assert_eq(bootstrap(&b, ENV("PMI_RANK=2", "PMI_SIZE=3", "MPI_LOCALRANKID=0",
                                   "MPI_LOCALNRANKS=1", "PIPERT_COORD=head:29500",
                                   "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.launcher, PT_LAUNCHER_PMI);
    cr_expect_eq(b.rank, 2);
    cr_expect_eq(b.local_rank, 0);
    cr_expect_eq(b.local_size, 1);
    cr_expect_not(b.hosts_coordinator);
    cr_assert_eq(bootstrap(&b, ENV("PMI_RANK=0", "PMI_SIZE=3", "PIPERT_COORD=head:29500",
                                   "PIPERT_SECRET=" SECRET)),
                 PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(b.local_rank, -1, "no local rank variable: unknown");
    cr_expect(b.hosts_coordinator);
    expect_error(ENV("PMI_RANK=0", "PMI_SIZE=3", "PIPERT_SECRET=" SECRET),
                 MENTIONS("PIPERT_COORD", "PMI"));
    expect_error(ENV("PMI_RANK=0", "PIPERT_COORD=h:1", "PIPERT_SECRET=" SECRET),
                 MENTIONS("PMI_SIZE"));
}

Test(bootstrap, no_launcher)
{
    expect_error(ENV("HOME=/root", "PATH=/usr/bin"),
                 MENTIONS("no launcher", "PIPERT_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                          "PMI_RANK"));
    expect_error((const char *const[]){NULL}, MENTIONS("no launcher"));
}

/* ---- node lists ------------------------------------------------------------- */

static void expect_hosts(const char *list, const char *const *expected)
{
    char **hosts;
    int count;
    cr_assert_eq(pt_nodelist_expand(list, &hosts, &count), PIPERT_OK, "'%s': %s", list,
                 pipert_last_error());
    int n = 0;
    while (expected[n]) n++;
    cr_expect_eq(count, n, "'%s' expands to %d hosts, expected %d", list, count, n);
    for (int i = 0; i < count && i < n; i++)
        cr_expect_str_eq(hosts[i], expected[i], "'%s': host %d is '%s', expected '%s'", list, i,
                         hosts[i], expected[i]);
    pt_nodelist_free(hosts, count);
}

Test(bootstrap, nodelist_expansion)
{
    expect_hosts("node[01-03,07],gpu5", MENTIONS("node01", "node02", "node03", "node07", "gpu5"));
    expect_hosts("solo", MENTIONS("solo"));
    expect_hosts("a,b,c", MENTIONS("a", "b", "c"));
    expect_hosts("n[8-11]", MENTIONS("n8", "n9", "n10", "n11"));
    expect_hosts("n[08-11]", MENTIONS("n08", "n09", "n10", "n11"));
    expect_hosts("n[098-101]", MENTIONS("n098", "n099", "n100", "n101"));
    expect_hosts("rack[1-2]-n[1-2]", MENTIONS("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"));
    expect_hosts("n[3]x,m[5,1]", MENTIONS("n3x", "m5", "m1"));
    expect_hosts("gpu-a100-[0-1].cluster", MENTIONS("gpu-a100-0.cluster", "gpu-a100-1.cluster"));
}

Test(bootstrap, nodelist_errors)
{
    static const char *const bad[] = {"", "node[1-3", "node1-3]", "node[3-1]", "node[]", "node[1,]",
                                      "node[,1]", "a,,b", "node[a-b]", "node[1-2-3]", "n[[1]]",
                                      "n[0-99999]", ",a"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char **hosts = (char **)1;
        int count = -1;
        cr_expect_eq(pt_nodelist_expand(bad[i], &hosts, &count), PIPERT_ERR_CONFIG,
                     "'%s' was accepted", bad[i]);
        cr_expect(strstr(pipert_last_error(), bad[i]), "the error for '%s' does not quote it: %s",
                  bad[i], pipert_last_error());
        cr_expect(hosts == NULL && count == 0, "'%s': outputs not cleared on failure", bad[i]);
    }
}

/* ---- layout ----------------------------------------------------------------- */

Test(bootstrap, rank_layout)
{
    /* rank = replica·S + stage, enumerated the other way round. */
    const int shapes[][2] = {{1, 1}, {1, 4}, {4, 1}, {2, 3}, {3, 2}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int S = shapes[k][0], R = shapes[k][1];
        int rank = 0;
        for (int replica = 0; replica < R; replica++)
            for (int stage = 0; stage < S; stage++, rank++) {
                int s = -1, r = -1;
                cr_assert_eq(pt_rank_layout(rank, S * R, S, &s, &r), PIPERT_OK);
                cr_expect(s == stage && r == replica,
                          "S=%d R=%d rank %d: got stage %d replica %d, expected %d %d", S, R, rank,
                          s, r, stage, replica);
            }
    }
    int s, r;
    cr_expect_eq(pt_rank_layout(0, 6, 4, &s, &r), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "6 workers") && strstr(pipert_last_error(), "4"),
              "%s", pipert_last_error());
    cr_expect_eq(pt_rank_layout(6, 6, 2, &s, &r), PIPERT_ERR_INVALID_ARG);
}

Test(bootstrap, layout)
{
    /* 2 stages x 3 replicas, written out: rank = replica·2 + stage. */
    pt_layout l;
    cr_assert_eq(pt_layout_make(6, 2, &l), PIPERT_OK, "%s", pipert_last_error());
    cr_expect(l.stages == 2 && l.replicas == 3, "got %d stages x %d replicas", l.stages,
              l.replicas);
    /* {stage, replica} of ranks 0..5 */
    const int expected[6][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}};
    for (int rank = 0; rank < 6; rank++) {
        cr_expect_eq(pt_layout_stage(&l, rank), expected[rank][0], "rank %d: stage", rank);
        cr_expect_eq(pt_layout_replica(&l, rank), expected[rank][1], "rank %d: replica", rank);
        cr_expect_eq(pt_layout_rank(&l, expected[rank][0], expected[rank][1]), rank,
                     "stage %d of replica %d", expected[rank][0], expected[rank][1]);
    }
    /* pt_layout_rank inverts (stage, replica) for every shape, and one replica's stages hold
     * consecutive ranks. */
    const int shapes[][2] = {{1, 1}, {1, 4}, {4, 1}, {2, 3}, {3, 2}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int S = shapes[k][0], R = shapes[k][1];
        cr_assert_eq(pt_layout_make(S * R, S, &l), PIPERT_OK, "%s", pipert_last_error());
        cr_expect(l.stages == S && l.replicas == R, "S=%d R=%d: got %d x %d", S, R, l.stages,
                  l.replicas);
        for (int rank = 0; rank < S * R; rank++) {
            const int stage = pt_layout_stage(&l, rank), replica = pt_layout_replica(&l, rank);
            cr_expect(stage >= 0 && stage < S && replica >= 0 && replica < R,
                      "S=%d R=%d rank %d: stage %d replica %d out of range", S, R, rank, stage,
                      replica);
            cr_expect_eq(pt_layout_rank(&l, stage, replica), rank, "S=%d R=%d rank %d", S, R,
                         rank);
            if (stage > 0)
                cr_expect_eq(pt_layout_rank(&l, stage - 1, replica), rank - 1,
                             "S=%d R=%d rank %d: stages of a replica are not consecutive", S, R,
                             rank);
        }
    }
    /* A world that is not a multiple of the stage count, and empty shapes. */
    cr_expect_eq(pt_layout_make(6, 4, &l), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "6 workers cannot form 4 pipeline stages"), "%s",
              pipert_last_error());
    cr_expect_eq(pt_layout_make(0, 1, &l), PIPERT_ERR_CONFIG);
    cr_expect_eq(pt_layout_make(4, 0, &l), PIPERT_ERR_CONFIG);
}

/* ---- the secret --------------------------------------------------------------- */

static bool is_lower_hex(const char *s, size_t n)
{
    if (strlen(s) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789abcdef", s[i])) return false;
    return true;
}

Test(bootstrap, secret_file_round_trip)
{
    char a[2 * PT_SECRET_BYTES + 1], b[2 * PT_SECRET_BYTES + 1];
    cr_assert_eq(pt_secret_generate(a), PIPERT_OK);
    cr_assert_eq(pt_secret_generate(b), PIPERT_OK);
    cr_expect(is_lower_hex(a, 64), "'%s' is not 64 hex digits", a);
    cr_expect_str_neq(a, b, "two generated secrets are equal");

    char dir[] = "/tmp/pipert-secret-XXXXXX", path[64], env_file[96];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/job.secret", dir);
    cr_assert_eq(pt_secret_write_file(path, a), PIPERT_OK, "%s", pipert_last_error());
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0600, "mode %04o, expected 0600", st.st_mode & 07777);
    cr_assert_eq(pt_secret_write_file(path, b), PIPERT_OK, "an existing file is replaced");

    snprintf(env_file, sizeof env_file, "PIPERT_SECRET_FILE=%s", path);
    pt_bootstrap boot;
    cr_assert_eq(bootstrap(&boot, ENV("PIPERT_RANK=0", "PIPERT_WORLD_SIZE=1", "PIPERT_LOCAL_RANK=0",
                                      "PIPERT_COORD=h:1", env_file)),
                 PIPERT_OK, "%s", pipert_last_error());
    char secret[PT_SECRET_MAX + 1];
    cr_assert_eq(pt_bootstrap_read_secret(&boot, secret), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_str_eq(secret, b);

    cr_assert_eq(chmod(path, 0644), 0);
    cr_expect_eq(pt_bootstrap_read_secret(&boot, secret), PIPERT_ERR_AUTH,
                 "a secret file readable by others was accepted");
    cr_expect(strstr(pipert_last_error(), path) && strstr(pipert_last_error(), "0644"), "%s",
              pipert_last_error());
    unlink(path);
    cr_expect_eq(pt_bootstrap_read_secret(&boot, secret), PIPERT_ERR_IO);
    cr_expect(strstr(pipert_last_error(), "PIPERT_SECRET_FILE"), "%s", pipert_last_error());
    rmdir(dir);
}

Test(bootstrap, secret_comparison)
{
    cr_expect(pt_secret_equal(SECRET, SECRET));
    cr_expect_not(pt_secret_equal(SECRET, SECRET "0"), "a longer secret matched");
    cr_expect_not(pt_secret_equal(SECRET "0", SECRET), "a shorter secret matched");
    cr_expect_not(pt_secret_equal(SECRET, "1123456789abcdef0123456789abcdef"), "first character");
    cr_expect_not(pt_secret_equal(SECRET, "0123456789abcdef0123456789abcdee"), "last character");
    cr_expect_not(pt_secret_equal(SECRET, ""));
}

/* The world ring (the coordinator-loss vote's group): every rank once, and each
 * neighbour (the last and the first too) shares a stage or a replica with it, for every
 * shape up to 7 x 7 (odd and even counts of both). 2 x 2 written out: 0, 1, 3, 2. */
Test(bootstrap, world_ring_uses_only_pipeline_and_replica_neighbours)
{
    pt_layout l = {.stages = 2, .replicas = 2};
    int ranks[49];
    pt_layout_world_ring(&l, ranks);
    const int expected[4] = {0, 1, 3, 2};
    for (int i = 0; i < 4; i++) cr_expect_eq(ranks[i], expected[i], "2 x 2: ring[%d]", i);
    for (int S = 1; S <= 7; S++)
        for (int R = 1; R <= 7; R++) {
            l = (pt_layout){.stages = S, .replicas = R};
            const int world = S * R;
            int seen[49] = {0};
            pt_layout_world_ring(&l, ranks);
            for (int i = 0; i < world; i++) {
                cr_assert(ranks[i] >= 0 && ranks[i] < world && !seen[ranks[i]]++,
                          "%d x %d: ring[%d] = %d", S, R, i, ranks[i]);
                const int a = ranks[i], b = ranks[(i + 1) % world];
                cr_expect(pt_layout_stage(&l, a) == pt_layout_stage(&l, b) ||
                              pt_layout_replica(&l, a) == pt_layout_replica(&l, b),
                          "%d stages x %d replicas: ranks %d and %d are neighbours in the ring "
                          "but share neither a stage nor a replica",
                          S, R, a, b);
            }
        }
}
