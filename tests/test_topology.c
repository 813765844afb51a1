#include <criterion/criterion.h>
#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/peak.h"
#include "runtime/topology.h"

/* The independent reference is Linux itself: sched_getaffinity for the PUs a
 * thread may run on, and sysfs thread_siblings_list for which PUs share a
 * physical core (hwloc reads other files and the CPUID instruction). */

static pt_topology *load_topology(void)
{
    pt_topology *t = NULL;
    pipert_result rc = pt_topology_load(&t);
    cr_assert_eq(rc, PIPERT_OK, "pt_topology_load: %s", pipert_last_error());
    cr_assert_not_null(t);
    return t;
}

static cpu_set_t thread_affinity(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0, "sched_getaffinity failed");
    return set;
}

/* The sysfs list of PUs sharing `cpu`'s core ("0,32" or "4-5"); 0 if sysfs
 * does not say. */
static int read_core_siblings(int cpu, char *buffer, size_t size)
{
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list",
             cpu);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(buffer, (int)size, f) != NULL;
    fclose(f);
    buffer[strcspn(buffer, "\n")] = '\0';
    return ok;
}

/* Physical cores among the PUs of `set`, counted as distinct sibling lists;
 * -1 if sysfs does not say. */
static int count_cores_in(const cpu_set_t *set)
{
    char seen[CPU_SETSIZE][64];
    int distinct = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, set)) continue;
        char siblings[64];
        if (!read_core_siblings(cpu, siblings, sizeof siblings)) return -1;
        int known = 0;
        for (int i = 0; i < distinct && !known; i++) known = !strcmp(seen[i], siblings);
        if (!known) strcpy(seen[distinct++], siblings);
    }
    return distinct;
}

static int lowest_cpu(const cpu_set_t *set)
{
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, set)) return cpu;
    return -1;
}

Test(topology, cores_and_pus_match_the_affinity_mask)
{
    pt_topology *t = load_topology();
    int cores = pt_topology_cores(t), pus = pt_topology_pus(t);
    cr_expect(cores >= 1 && cores <= pus, "cores %d, PUs %d: need 1 <= cores <= PUs", cores, pus);

    cpu_set_t mask = thread_affinity();
    cr_expect_eq(pus, CPU_COUNT(&mask), "hwloc PUs %d, sched_getaffinity %d", pus,
                 CPU_COUNT(&mask));
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cr_expect(pus <= online, "PUs %d > %ld online processors", pus, online);

    int reference_cores = count_cores_in(&mask);
    if (reference_cores < 0)
        cr_log_warn("sysfs has no thread_siblings_list: core count not cross-checked");
    else
        cr_expect_eq(cores, reference_cores, "hwloc cores %d, sysfs sibling groups %d", cores,
                     reference_cores);
    pt_topology_free(t);
}

/* After binding to core `index`, the thread's mask is exactly the allowed
 * PUs of one physical core. Returns that mask. */
static cpu_set_t expect_bound_to_one_core(const cpu_set_t *before, int index)
{
    cpu_set_t after = thread_affinity();
    cr_assert(CPU_COUNT(&after) >= 1, "core %d: empty affinity after binding", index);
    cpu_set_t outside;
    CPU_AND(&outside, &after, before);
    cr_expect(CPU_EQUAL(&outside, &after), "core %d: bound to PUs outside the process's mask",
              index);

    char siblings[64];
    if (!read_core_siblings(lowest_cpu(&after), siblings, sizeof siblings)) return after;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, before)) continue;
        char other[64];
        cr_assert(read_core_siblings(cpu, other, sizeof other));
        int same_core = !strcmp(siblings, other);
        cr_expect_eq(CPU_ISSET(cpu, &after) != 0, same_core,
                     "core %d: PU %d is %s the bound mask but %s the core of PU %d (%s)", index,
                     cpu, CPU_ISSET(cpu, &after) ? "in" : "not in", same_core ? "in" : "not in",
                     lowest_cpu(&after), siblings);
    }
    return after;
}

Test(topology, bind_thread_to_core_zero)
{
    pt_topology *t = load_topology();
    cpu_set_t before = thread_affinity();
    pipert_result rc = pt_topology_bind_thread_to_cores(t, 0, 1);
    cr_assert_eq(rc, PIPERT_OK, "bind to core 0: %s", pipert_last_error());
    cpu_set_t first = expect_bound_to_one_core(&before, 0);
    /* Core 0 is this process's first core: it holds the lowest allowed PU. */
    cr_expect(CPU_ISSET(lowest_cpu(&before), &first), "core 0 does not hold PU %d",
              lowest_cpu(&before));

    int last = pt_topology_cores(t) - 1;
    if (last > 0) {
        cr_assert_eq(pt_topology_bind_thread_to_cores(t, last, 1), PIPERT_OK, "bind to core %d: %s",
                     last, pipert_last_error());
        cpu_set_t other = expect_bound_to_one_core(&before, last);
        cpu_set_t shared;
        CPU_AND(&shared, &first, &other);
        cr_expect_eq(CPU_COUNT(&shared), 0, "cores 0 and %d share PUs", last);

        cr_assert_eq(pt_topology_bind_thread_to_cores(t, 0, last + 1), PIPERT_OK,
                     "bind to all cores: %s", pipert_last_error());
        cpu_set_t all = thread_affinity();
        cr_expect(CPU_EQUAL(&all, &before), "binding to all %d cores did not restore the mask",
                  last + 1);
    }
    pt_topology_free(t);
}

static void *report_affinity(void *out)
{
    cpu_set_t *set = out;
    CPU_ZERO(set);
    sched_getaffinity(0, sizeof *set, set);
    return NULL;
}

Test(topology, bind_process_is_inherited_and_seen_by_a_new_topology)
{
    pt_topology *t = load_topology();
    cpu_set_t before = thread_affinity();
    cr_assert_eq(pt_topology_bind_process_to_cores(t, 0, 1), PIPERT_OK, "bind process: %s",
                 pipert_last_error());
    cpu_set_t mine = expect_bound_to_one_core(&before, 0);

    pthread_t thread;
    cpu_set_t child;
    cr_assert_eq(pthread_create(&thread, NULL, report_affinity, &child), 0);
    pthread_join(thread, NULL);
    cr_expect(CPU_EQUAL(&child, &mine), "a thread created after binding has %d PUs, not %d",
              CPU_COUNT(&child), CPU_COUNT(&mine));

    pt_topology *bound = load_topology();
    cr_expect_eq(pt_topology_cores(bound), 1, "after binding to one core, a new topology has %d",
                 pt_topology_cores(bound));
    cr_expect_eq(pt_topology_pus(bound), CPU_COUNT(&mine));
    pt_topology_free(bound);
    pt_topology_free(t);
}

Test(topology, binding_out_of_range_fails_naming_the_range)
{
    pt_topology *t = load_topology();
    int cores = pt_topology_cores(t);
    cpu_set_t before = thread_affinity();
    char expected[128];

    cr_expect_eq(pt_topology_bind_thread_to_cores(t, cores - 1, 2), PIPERT_ERR_INVALID_ARG);
    snprintf(expected, sizeof expected, "cores %d..%d: only %d cores", cores - 1, cores, cores);
    cr_expect(strstr(pipert_last_error(), expected), "message '%s' lacks '%s'",
              pipert_last_error(), expected);

    cr_expect_eq(pt_topology_bind_process_to_cores(t, cores, 1), PIPERT_ERR_INVALID_ARG);
    snprintf(expected, sizeof expected, "cores %d..%d: only %d cores", cores, cores, cores);
    cr_expect(strstr(pipert_last_error(), expected), "message '%s' lacks '%s'",
              pipert_last_error(), expected);

    cr_expect_eq(pt_topology_bind_thread_to_cores(t, -1, 1), PIPERT_ERR_INVALID_ARG);
    cr_expect_eq(pt_topology_bind_thread_to_cores(t, 0, 0), PIPERT_ERR_INVALID_ARG);
    cpu_set_t after = thread_affinity();
    cr_expect(CPU_EQUAL(&before, &after), "a failed bind changed the affinity");
    pt_topology_free(t);
}

Test(topology, describe_names_cores_and_memory)
{
    pt_topology *t = load_topology();
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    cr_assert_not_null(out);
    pt_topology_describe(t, out);
    fclose(out);
    char expected[64];
    snprintf(expected, sizeof expected, "%d available to this process", pt_topology_cores(t));
    cr_expect(strstr(text, "cores"), "no 'cores' in:\n%s", text);
    cr_expect(strstr(text, expected), "no '%s' in:\n%s", expected, text);
    cr_expect(strstr(text, "memory"), "no 'memory' in:\n%s", text);
    cr_expect(strstr(text, "L1d"), "no 'L1d' in:\n%s", text);
    free(text);
    pt_topology_free(t);
}

static json_int_t expect_integer(const json_t *object, const char *key)
{
    const json_t *value = json_object_get(object, key);
    cr_expect(json_is_integer(value), "'%s' is missing or not an integer", key);
    return json_integer_value(value);
}

/* Σ "Node N MemTotal" over /sys/devices/system/node/node*\/meminfo; 0 if none. */
static double sysfs_numa_memory_bytes(void)
{
    glob_t files;
    double total = 0;
    if (glob("/sys/devices/system/node/node*/meminfo", 0, NULL, &files) != 0) return 0;
    for (size_t i = 0; i < files.gl_pathc; i++) {
        FILE *f = fopen(files.gl_pathv[i], "r");
        char line[256];
        while (f && fgets(line, sizeof line, f)) {
            int node;
            double kilobytes;
            if (sscanf(line, "Node %d MemTotal: %lf kB", &node, &kilobytes) == 2)
                total += 1024 * kilobytes;
        }
        if (f) fclose(f);
    }
    globfree(&files);
    return total;
}

Test(topology, json_has_the_fields)
{
    pt_topology *t = load_topology();
    json_t *host = pt_topology_to_json(t);
    cr_assert_not_null(host);

    cr_expect(json_is_string(json_object_get(host, "name")), "'name' is not a string");
    char hostname[256] = "";
    gethostname(hostname, sizeof hostname - 1);
    cr_expect_str_eq(json_string_value(json_object_get(host, "name")), hostname);
    cr_expect_eq(expect_integer(host, "cores"), pt_topology_cores(t));
    cr_expect_eq(expect_integer(host, "pus"), pt_topology_pus(t));
    cr_expect(expect_integer(host, "machine_cores") >= pt_topology_cores(t));
    cr_expect(expect_integer(host, "machine_pus") >= pt_topology_pus(t));
    cr_expect(expect_integer(host, "packages") >= 1);

    /* Total memory against the kernel's MemTotal: per NUMA node where sysfs
     * has nodes (sandboxes may report less there than in /proc/meminfo, and
     * hwloc follows the nodes), else the whole machine's. Rounding to kB and
     * pages is far below the 1 % allowed. */
    double memory = (double)expect_integer(host, "memory_bytes");
    double reference = sysfs_numa_memory_bytes();
    if (reference <= 0)
        reference = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    cr_expect(fabs(memory - reference) <= 0.01 * reference,
              "memory_bytes %.0f, the kernel reports %.0f", memory, reference);

    const json_t *nodes = json_object_get(host, "numa_nodes");
    cr_assert(json_is_array(nodes) && json_array_size(nodes) >= 1, "numa_nodes: need an array");
    double node_memory = 0;
    json_int_t node_cores = 0;
    for (size_t i = 0; i < json_array_size(nodes); i++) {
        const json_t *node = json_array_get(nodes, i);
        expect_integer(node, "os_index");
        node_memory += (double)expect_integer(node, "memory_bytes");
        node_cores += expect_integer(node, "cores");
    }
    cr_expect_eq(node_memory, memory, "NUMA nodes hold %.0f bytes, the machine %.0f",
                 node_memory, memory);
    cr_expect_eq(node_cores, pt_topology_cores(t), "NUMA nodes hold %lld cores, not %d",
                 (long long)node_cores, pt_topology_cores(t));

    const json_t *caches = json_object_get(host, "caches");
    cr_assert(json_is_object(caches), "caches: need an object");
    expect_integer(caches, "l1d_bytes");
    expect_integer(caches, "l2_bytes");
    expect_integer(caches, "l3_bytes");
    json_decref(host);
    pt_topology_free(t);
}

Test(peak, gemm_gflops_of_a_small_shape)
{
    double gflops = pt_cpu_gemm_gflops(96, 64, 80, 3);
    cr_expect(gflops > 0 && isfinite(gflops), "96x64x80 GEMM: %g GFLOP/s", gflops);

    cr_expect_eq(pt_cpu_gemm_gflops(0, 64, 80, 3), 0.0);
    cr_expect(strstr(pipert_last_error(), "m=0"), "message: %s", pipert_last_error());
    cr_expect_eq(pt_cpu_gemm_gflops(8, 8, 8, 0), 0.0);
}

Test(peak, measures_and_restores_the_thread_setting, .timeout = 25)
{
    int threads_before = omp_get_max_threads();
    pt_gemm_peak peak;
    pipert_result rc = pt_cpu_gemm_peak(1, &peak);
    cr_assert_eq(rc, PIPERT_OK, "pt_cpu_gemm_peak: %s", pipert_last_error());
    cr_expect_eq(peak.threads, 1);
    cr_expect(peak.size >= 1024 && peak.repeats >= 3, "size %d, repeats %d", peak.size,
              peak.repeats);
    cr_expect(peak.gflops_median > 0 && isfinite(peak.gflops_median), "median %g",
              peak.gflops_median);
    cr_expect(peak.gflops_best >= peak.gflops_median, "best %g < median %g", peak.gflops_best,
              peak.gflops_median);
    /* seconds and GFLOP/s describe the same median time */
    double flops = 2.0 * peak.size * (double)peak.size * peak.size;
    cr_expect(fabs(1e-9 * flops / peak.seconds - peak.gflops_median) <= 1e-9 * peak.gflops_median,
              "seconds %g disagrees with %g GFLOP/s", peak.seconds, peak.gflops_median);
    cr_expect_eq(omp_get_max_threads(), threads_before, "thread setting %d, was %d",
                 omp_get_max_threads(), threads_before);
}
