#include "runtime/topology.h"

#include <errno.h>
#include <hwloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct pt_topology {
    hwloc_topology_t hwloc;
    hwloc_bitmap_t allowed; /* the PUs this process may run on */
    int pu_count;           /* PUs in `allowed` */
    int core_count;
    hwloc_obj_t *cores;     /* [core_count] cores with at least one allowed PU, logical order */
};

/* The PUs this process may run on: its affinity mask (the union over its
 * threads), within what the topology holds. Falls back to everything hwloc
 * allows when the mask cannot be read. */
static pipert_result read_allowed_pus(pt_topology *t)
{
    hwloc_const_cpuset_t topology_set = hwloc_topology_get_allowed_cpuset(t->hwloc);
    t->allowed = hwloc_bitmap_alloc();
    if (!t->allowed) return pt_fail(PIPERT_ERR_NOMEM, "topology: cannot allocate a cpuset");
    if (hwloc_get_cpubind(t->hwloc, t->allowed, HWLOC_CPUBIND_PROCESS) != 0 ||
        hwloc_bitmap_and(t->allowed, t->allowed, topology_set) != 0 ||
        hwloc_bitmap_iszero(t->allowed)) {
        if (hwloc_bitmap_copy(t->allowed, topology_set) != 0)
            return pt_fail(PIPERT_ERR_NOMEM, "topology: cannot copy a cpuset");
    }
    t->pu_count = hwloc_bitmap_weight(t->allowed);
    if (t->pu_count < 1)
        return pt_fail(PIPERT_ERR_INTERNAL, "topology: hwloc reports no processing units");
    return PIPERT_OK;
}

/* Lists the cores with an allowed PU. Where hwloc knows no cores (some
 * virtual machines and architectures), each PU counts as a core. */
static pipert_result list_allowed_cores(pt_topology *t)
{
    hwloc_obj_type_t type =
        hwloc_get_nbobjs_by_type(t->hwloc, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int total = hwloc_get_nbobjs_by_type(t->hwloc, type);
    t->cores = calloc(total > 0 ? (size_t)total : 1, sizeof *t->cores);
    if (!t->cores) return pt_fail(PIPERT_ERR_NOMEM, "topology: cannot list %d cores", total);
    for (hwloc_obj_t core = NULL; (core = hwloc_get_next_obj_by_type(t->hwloc, type, core));)
        if (core->cpuset && hwloc_bitmap_intersects(core->cpuset, t->allowed))
            t->cores[t->core_count++] = core;
    if (t->core_count < 1)
        return pt_fail(PIPERT_ERR_INTERNAL, "topology: none of this process's PUs is in a core");
    return PIPERT_OK;
}

pipert_result pt_topology_load(pt_topology **out)
{
    *out = NULL;
    pt_topology *t = calloc(1, sizeof *t);
    if (!t) return pt_fail(PIPERT_ERR_NOMEM, "topology: out of memory");
    if (hwloc_topology_init(&t->hwloc) != 0) {
        free(t);
        return pt_fail(PIPERT_ERR_NOMEM, "topology: hwloc_topology_init failed: %s",
                       strerror(errno));
    }
    if (hwloc_topology_load(t->hwloc) != 0) {
        pipert_result rc = pt_fail(PIPERT_ERR_UNSUPPORTED,
                                   "topology: hwloc cannot discover this machine: %s",
                                   strerror(errno));
        pt_topology_free(t);
        return rc;
    }
    pipert_result rc = read_allowed_pus(t);
    if (rc == PIPERT_OK) rc = list_allowed_cores(t);
    if (rc != PIPERT_OK) {
        pt_topology_free(t);
        return rc;
    }
    *out = t;
    return PIPERT_OK;
}

void pt_topology_free(pt_topology *t)
{
    if (!t) return;
    free(t->cores);
    if (t->allowed) hwloc_bitmap_free(t->allowed);
    if (t->hwloc) hwloc_topology_destroy(t->hwloc);
    free(t);
}

int pt_topology_cores(const pt_topology *t) { return t->core_count; }

int pt_topology_pus(const pt_topology *t) { return t->pu_count; }

/* ---- binding ------------------------------------------------------------ */

static pipert_result bind_to_cores(const pt_topology *t, int first, int count, int flags,
                                   const char *who)
{
    if (count < 1 || first < 0 || first > t->core_count - count) {
        if (count < 1)
            return pt_fail(PIPERT_ERR_INVALID_ARG, "cannot bind %s to %d cores starting at %d",
                           who, count, first);
        return pt_fail(PIPERT_ERR_INVALID_ARG, "cannot bind %s to cores %d..%d: only %d cores",
                       who, first, first + count - 1, t->core_count);
    }
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return pt_fail(PIPERT_ERR_NOMEM, "cannot bind %s: out of memory", who);
    for (int i = first; i < first + count; i++)
        hwloc_bitmap_or(set, set, t->cores[i]->cpuset);
    /* Only the PUs this process was given: an SMT sibling outside its mask
     * would make the call fail in a cgroup. */
    hwloc_bitmap_and(set, set, t->allowed);
    pipert_result rc = PIPERT_OK;
    if (hwloc_set_cpubind(t->hwloc, set, flags) != 0) {
        int saved = errno;
        char *pus = NULL;
        hwloc_bitmap_list_asprintf(&pus, set);
        rc = pt_fail(PIPERT_ERR_UNSUPPORTED, "cannot bind %s to cores %d..%d (PUs %s): %s", who,
                     first, first + count - 1, pus ? pus : "?", strerror(saved));
        free(pus);
    }
    hwloc_bitmap_free(set);
    return rc;
}

pipert_result pt_topology_bind_thread_to_cores(const pt_topology *t, int first, int count)
{
    return bind_to_cores(t, first, count, HWLOC_CPUBIND_THREAD, "thread");
}

pipert_result pt_topology_bind_process_to_cores(const pt_topology *t, int first, int count)
{
    return bind_to_cores(t, first, count, HWLOC_CPUBIND_PROCESS, "process");
}

/* ---- description -------------------------------------------------------- */

typedef struct cache_levels {
    uint64_t l1d, l2, l3; /* bytes of one instance; 0 if hwloc knows none */
} cache_levels;

static uint64_t cache_size(const pt_topology *t, hwloc_obj_type_t type)
{
    hwloc_obj_t cache = hwloc_get_obj_by_type(t->hwloc, type, 0);
    return cache && cache->attr ? cache->attr->cache.size : 0;
}

static cache_levels read_caches(const pt_topology *t)
{
    return (cache_levels){.l1d = cache_size(t, HWLOC_OBJ_L1CACHE),
                          .l2 = cache_size(t, HWLOC_OBJ_L2CACHE),
                          .l3 = cache_size(t, HWLOC_OBJ_L3CACHE)};
}

/* The CPU name hwloc found (on a package on x86, elsewhere on the root). */
static const char *cpu_model(const pt_topology *t)
{
    hwloc_obj_t package = hwloc_get_obj_by_type(t->hwloc, HWLOC_OBJ_PACKAGE, 0);
    const char *model = package ? hwloc_obj_get_info_by_name(package, "CPUModel") : NULL;
    if (!model) model = hwloc_obj_get_info_by_name(hwloc_get_root_obj(t->hwloc), "CPUModel");
    return model;
}

static const char *machine_model(const pt_topology *t)
{
    return hwloc_obj_get_info_by_name(hwloc_get_root_obj(t->hwloc), "DMIProductName");
}

static int count_of(const pt_topology *t, hwloc_obj_type_t type)
{
    int n = hwloc_get_nbobjs_by_type(t->hwloc, type);
    return n > 0 ? n : 0;
}

/* All the machine's cores (or PUs, where hwloc knows no cores), this
 * process's or not. */
static int machine_cores(const pt_topology *t)
{
    return count_of(t, t->cores[0]->type);
}

/* This process's cores that lie in a NUMA node. */
static int cores_in_node(const pt_topology *t, hwloc_obj_t node)
{
    int n = 0;
    for (int i = 0; i < t->core_count; i++)
        if (node->cpuset && hwloc_bitmap_intersects(t->cores[i]->cpuset, node->cpuset)) n++;
    return n;
}

/* "4.46 GiB", "512 KiB" */
static const char *format_bytes(char buffer[32], uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1024 && unit < 4) {
        value /= 1024;
        unit++;
    }
    if (value == (double)(uint64_t)value)
        snprintf(buffer, 32, "%.0f %s", value, units[unit]);
    else
        snprintf(buffer, 32, "%.2f %s", value, units[unit]);
    return buffer;
}

static void describe_cache(FILE *out, const char *name, uint64_t bytes, int instances,
                           const char *separator)
{
    char size[32];
    if (bytes)
        fprintf(out, "%s %s x%d%s", name, format_bytes(size, bytes), instances, separator);
    else
        fprintf(out, "%s unknown%s", name, separator);
}

void pt_topology_describe(const pt_topology *t, FILE *out)
{
    char size[32];
    const char *machine = machine_model(t), *cpu = cpu_model(t);
    hwloc_obj_t root = hwloc_get_root_obj(t->hwloc);

    fprintf(out, "machine:    %s\n", machine ? machine : "unknown");
    fprintf(out, "cpu:        %s\n", cpu ? cpu : "unknown");
    fprintf(out, "packages:   %d\n", count_of(t, HWLOC_OBJ_PACKAGE));
    fprintf(out, "numa nodes: %d\n", count_of(t, HWLOC_OBJ_NUMANODE));
    for (hwloc_obj_t node = NULL;
         (node = hwloc_get_next_obj_by_type(t->hwloc, HWLOC_OBJ_NUMANODE, node));)
        fprintf(out, "  node %u: %s, %d of this process's cores\n", node->os_index,
                format_bytes(size, node->attr->numanode.local_memory), cores_in_node(t, node));
    fprintf(out, "cores:      %d available to this process (of %d on the machine)\n",
            t->core_count, machine_cores(t));
    fprintf(out, "PUs:        %d hardware threads available (of %d)\n", t->pu_count,
            count_of(t, HWLOC_OBJ_PU));
    cache_levels caches = read_caches(t);
    fprintf(out, "caches:     ");
    describe_cache(out, "L1d", caches.l1d, count_of(t, HWLOC_OBJ_L1CACHE), ", ");
    describe_cache(out, "L2", caches.l2, count_of(t, HWLOC_OBJ_L2CACHE), ", ");
    describe_cache(out, "L3", caches.l3, count_of(t, HWLOC_OBJ_L3CACHE), "\n");
    fprintf(out, "memory:     %s\n", format_bytes(size, root->total_memory));
}

/* ---- JSON --------------------------------------------------------------- */

/* Each setter returns nonzero on failure (a NULL value: out of memory), so a
 * whole object is built first and checked once. */
static int set_value(json_t *object, const char *key, json_t *value)
{
    return json_object_set_new(object, key, value) != 0;
}

static int set_int(json_t *object, const char *key, uint64_t value)
{
    return set_value(object, key, json_integer((json_int_t)value));
}

static int set_string_or_null(json_t *object, const char *key, const char *value)
{
    json_t *string = value ? json_string(value) : NULL; /* NULL also when not UTF-8 */
    return set_value(object, key, string ? string : json_null());
}

static json_t *numa_nodes_to_json(const pt_topology *t)
{
    json_t *nodes = json_array();
    if (!nodes) return NULL;
    int failed = 0;
    for (hwloc_obj_t node = NULL;
         (node = hwloc_get_next_obj_by_type(t->hwloc, HWLOC_OBJ_NUMANODE, node));) {
        json_t *entry = json_object();
        if (!entry) {
            failed = 1;
            break;
        }
        failed |= set_int(entry, "os_index", node->os_index);
        failed |= set_int(entry, "memory_bytes", node->attr->numanode.local_memory);
        failed |= set_int(entry, "cores", (uint64_t)cores_in_node(t, node));
        failed |= json_array_append_new(nodes, entry) != 0;
    }
    if (failed) {
        json_decref(nodes);
        return NULL;
    }
    return nodes;
}

static json_t *caches_to_json(const pt_topology *t)
{
    json_t *object = json_object();
    if (!object) return NULL;
    cache_levels caches = read_caches(t);
    int failed = set_int(object, "l1d_bytes", caches.l1d);
    failed |= set_int(object, "l2_bytes", caches.l2);
    failed |= set_int(object, "l3_bytes", caches.l3);
    if (failed) {
        json_decref(object);
        return NULL;
    }
    return object;
}

json_t *pt_topology_to_json(const pt_topology *t)
{
    json_t *host = json_object();
    if (!host) return NULL;
    char name[256] = "";
    if (gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
    name[sizeof name - 1] = '\0';

    int failed = set_string_or_null(host, "name", name[0] ? name : NULL);
    failed |= set_string_or_null(host, "machine", machine_model(t));
    failed |= set_string_or_null(host, "cpu_model", cpu_model(t));
    failed |= set_int(host, "packages", (uint64_t)count_of(t, HWLOC_OBJ_PACKAGE));
    failed |= set_int(host, "cores", (uint64_t)t->core_count);
    failed |= set_int(host, "pus", (uint64_t)t->pu_count);
    failed |= set_int(host, "machine_cores", (uint64_t)machine_cores(t));
    failed |= set_int(host, "machine_pus", (uint64_t)count_of(t, HWLOC_OBJ_PU));
    failed |= set_int(host, "memory_bytes", hwloc_get_root_obj(t->hwloc)->total_memory);
    failed |= set_value(host, "numa_nodes", numa_nodes_to_json(t));
    failed |= set_value(host, "caches", caches_to_json(t));
    if (failed) {
        json_decref(host);
        return NULL;
    }
    return host;
}

pipert_result pt_topology_compute_threads(int configured, int *threads)
{
    if (configured > 0) {
        *threads = configured;
        return PIPERT_OK;
    }
    pt_topology *topology;
    PT_TRY(pt_topology_load(&topology));
    *threads = pt_topology_cores(topology);
    pt_topology_free(topology);
    return PIPERT_OK;
}
