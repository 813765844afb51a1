/* Cluster descriptions (scheduler/cluster.h): sites and links read exactly as
 * written, and every malformed file refused naming the file and the field. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/error.h"
#include "scheduler/cluster.h"

static char path[64];

static const char *write_cluster(const char *text)
{
    snprintf(path, sizeof path, "/tmp/pipert-cluster-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void expect_refused(const char *text, const char *message_after_path)
{
    pt_cluster c;
    const char *p = write_cluster(text);
    cr_expect_eq(pt_cluster_load(p, &c), PIPERT_ERR_CONFIG, "accepted:\n%s", text);
    char expected[512];
    snprintf(expected, sizeof expected, "%s%s", p, message_after_path);
    cr_expect_str_eq(pipert_last_error(), expected, "for\n%s\ngot      %s\nexpected %s", text,
                     pipert_last_error(), expected);
    cr_expect_eq(c.n_sites, 0, "a refused file leaves an empty cluster");
    unlink(p);
}

Test(cluster, sites_and_links_as_written)
{
    pt_cluster c;
    const char *p = write_cluster(
        "{\"sites\": [{\"name\": \"oregon\"}, {\"name\": \"virginia\"}, {\"name\": \"seoul\", "
        "\"groups\": []}],\n"
        " \"links\": [{\"between\": [\"oregon\", \"virginia\"], \"bandwidth\": \"790mbit\", "
        "\"latency\": \"33ms\"},\n"
        "           {\"from\": \"seoul\", \"to\": \"oregon\", \"bandwidth\": \"340mbit\", "
        "\"latency\": \"62ms\"}],\n"
        " \"default_link\": {\"bandwidth\": \"100mbit\", \"latency\": \"119ms\"}}");
    cr_assert_eq(pt_cluster_load(p, &c), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(c.n_sites, 3);
    cr_expect_str_eq(c.site_names[0], "oregon");
    cr_expect_str_eq(c.site_names[2], "seoul");
    const struct { int from, to; double bits, latency; } expected[] = {
        {0, 1, 790e6, 0.033}, {1, 0, 790e6, 0.033}, /* between: both ways */
        {2, 0, 340e6, 0.062},                       /* from/to: one way */
        {0, 2, 100e6, 0.119}, {1, 2, 100e6, 0.119}, {2, 1, 100e6, 0.119}, /* the default */
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        const pt_cluster_link *l = &c.links[expected[i].from * 3 + expected[i].to];
        cr_expect_float_eq(l->bits_per_s, expected[i].bits, 1e-3, "%d -> %d", expected[i].from,
                           expected[i].to);
        cr_expect_float_eq(l->latency_s, expected[i].latency, 1e-12, "%d -> %d", expected[i].from,
                           expected[i].to);
    }
    pt_cluster_free(&c);
    unlink(p);
}

/* Positions are counted by hand: line:column of the value at fault, of the
 * key when it is unknown, of the object when a key is missing. */
Test(cluster, malformed_files_are_refused_by_position_and_field)
{
    expect_refused("{\"sites\": [{\"name\": \"a\"}, ]}", ":1:27: unexpected token near ']'");
    expect_refused("[]", ":1:1: top level: expected a JSON object");
    expect_refused("{\"site\": []}", ":1:2: top level: unknown key 'site'");
    expect_refused("{\"sites\": []}", ":1:11: sites: expected a list of 1 to 254 sites");
    expect_refused("{\"sites\": [{\"name\": \"a\"}, {\"name\": \"a\"}]}",
                   ":1:36: sites[1].name: site 'a' is named twice");
    expect_refused("{\"sites\": [{\"nme\": \"a\"}]}", ":1:13: sites[0]: unknown key 'nme'");
    expect_refused("{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}]}",
                   ":1:1: links: no link from 'a' to 'b' (list it, or give a default_link)");
}

#define TWO_SITES "{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}],\n \"links\": [\n   "

Test(cluster, malformed_links_are_refused_by_position_and_field)
{
    expect_refused(TWO_SITES "{\"between\": [\"a\", \"c\"], \"bandwidth\": \"1gbit\", \"latency\": \"1ms\"}]}",
                   ":3:22: links[0].between[1]: 'c' is not one of the sites");
    expect_refused(TWO_SITES "{\"from\": \"a\", \"to\": \"x\", \"bandwidth\": \"1gbit\", \"latency\": \"1ms\"}]}",
                   ":3:24: links[0].to: 'x' is not one of the sites");
    expect_refused(TWO_SITES "{\"between\": [\"a\", \"b\"], \"bandwidth\": \"fast\", \"latency\": \"1ms\"}]}",
                   ":3:41: links[0].bandwidth: expected a positive bit rate such as 100mbit or 1gbit, "
                   "got 'fast'");
    expect_refused(TWO_SITES "{\"between\": [\"a\", \"b\"], \"bandwidth\": \"1gbit\"}]}",
                   ":3:4: links[0].latency: missing, e.g. \"50ms\"");
    expect_refused(TWO_SITES "{\"between\": [\"a\", \"a\"], \"bandwidth\": \"1gbit\", \"latency\": \"1ms\"}]}",
                   ":3:4: links[0]: a link joins two different sites");
    expect_refused(TWO_SITES "{\"between\": [\"a\", \"b\"], \"bandwidth\": \"1gbit\", \"latency\": \"1ms\"},\n"
                   "   {\"from\": \"b\", \"to\": \"a\", \"bandwidth\": \"1gbit\", \"latency\": \"1ms\", \"loss\": 0}]}",
                   ":4:69: links[1]: unknown key 'loss'");
}

Test(cluster, an_unreadable_file_is_an_io_error)
{
    pt_cluster c;
    cr_expect_eq(pt_cluster_load("/nonexistent/cluster.json", &c), PIPERT_ERR_IO);
    cr_expect(strstr(pipert_last_error(), "/nonexistent/cluster.json"), "%s", pipert_last_error());
}

/* ---- device groups -------------------------------------------------------------- */

Test(cluster, groups_as_written)
{
    const char *p = write_cluster(
        "{\"description\": \"two sites\", \"source\": \"by hand\",\n"
        " \"sites\": [{\"name\": \"a\", \"groups\": [\n"
        "   {\"name\": \"h100\", \"kind\": \"cuda\", \"count\": 8, \"fp32_flops\": 6.7e13,\n"
        "    \"bf16_flops\": 9.89e14, \"memory\": \"80gib\",\n"
        "    \"link\": {\"bandwidth\": \"3600gbit\", \"latency\": \"2us\"}},\n"
        "   {\"name\": \"host\", \"kind\": \"cpu\", \"count\": 2, \"fp32_flops\": 1e12, \"memory\": \"512GB\"}]},\n"
        "  {\"name\": \"b\", \"groups\": [{\"name\": \"h100\", \"kind\": \"cuda\", \"count\": 4,\n"
        "    \"fp32_flops\": 6.7e13, \"memory\": \"96gib\"}]}],\n"
        " \"default_link\": {\"bandwidth\": \"1gbit\", \"latency\": \"10ms\"}}");
    pt_cluster c;
    cr_assert_eq(pt_cluster_load(p, &c), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(c.n_groups, 3);
    const pt_cluster_group *g = c.groups;
    cr_expect_str_eq(g[0].name, "h100");
    cr_expect_eq(g[0].site, 0);
    cr_expect_str_eq(g[0].kind, "cuda");
    cr_expect_eq(g[0].count, 8);
    cr_expect_float_eq(g[0].fp32_flops, 6.7e13, 1);
    cr_expect_float_eq(g[0].bf16_flops, 9.89e14, 1);
    cr_expect_float_eq(g[0].memory_bytes, 80.0 * 1073741824.0, 1);
    cr_expect_float_eq(g[0].link.bits_per_s, 3.6e12, 1);
    cr_expect_float_eq(g[0].link.latency_s, 2e-6, 1e-12);
    cr_expect_float_eq(g[1].memory_bytes, 512e9, 1);
    cr_expect_eq(g[1].bf16_flops, 0);
    cr_expect_float_eq(g[1].link.bits_per_s, 100e9, 1, "the default link inside a group");
    cr_expect_float_eq(g[0].memory_bytes_per_s, 1.5e12, 1, "cuda's default memory bandwidth");
    cr_expect_float_eq(g[1].memory_bytes_per_s, 2e10, 1, "cpu's default memory bandwidth");
    cr_expect_eq(g[2].site, 1);
    cr_expect_eq(pt_cluster_devices(&c), 14);
    pt_cluster_free(&c);
    unlink(p);
}

#define SITE_WITH(group) "{\"sites\": [{\"name\": \"a\", \"groups\": [" group "]}]}"
#define GOOD "\"name\": \"g\", \"kind\": \"cpu\", \"count\": 1, \"fp32_flops\": 1e11, \"memory\": \"1gib\""

/* SITE_WITH's first group starts at column 37. */
Test(cluster, malformed_groups_are_refused_by_position_and_field)
{
    expect_refused(SITE_WITH("{\"kind\": \"cpu\", \"count\": 1, \"fp32_flops\": 1, \"memory\": \"1gb\"}"),
                   ":1:37: sites[0].groups[0].name: expected a name of 1 to 63 characters");
    expect_refused(SITE_WITH("{\"name\": \"g\", \"kind\": \"tpu\", \"count\": 1, \"fp32_flops\": 1, "
                             "\"memory\": \"1gb\"}"),
                   ":1:59: sites[0].groups[0].kind: expected \"cuda\" or \"cpu\"");
    expect_refused(SITE_WITH("{\"name\": \"g\", \"kind\": \"cpu\", \"fp32_flops\": 1, \"memory\": \"1gb\"}"),
                   ":1:37: sites[0].groups[0].count: expected a number of devices from 1 to 1000000");
    expect_refused(SITE_WITH("{\"name\": \"g\", \"kind\": \"cpu\", \"count\": 1, \"fp32_flops\": 0, "
                             "\"memory\": \"1gb\"}"),
                   ":1:92: sites[0].groups[0].fp32_flops: expected a positive number, e.g. 6.7e13");
    expect_refused(SITE_WITH("{\"name\": \"g\", \"kind\": \"cpu\", \"count\": 1, \"fp32_flops\": 1, "
                             "\"memory\": \"80 apples\"}"),
                   ":1:105: sites[0].groups[0].memory: expected a positive size such as 80gib or "
                   "512mb, got '80 apples'");
    expect_refused(SITE_WITH("{" GOOD "},\n {" GOOD "}"),
                   ":2:11: sites[0].groups[1].name: group 'g' is named twice in site 'a'");
    expect_refused(SITE_WITH("{" GOOD ",\n \"speed\": 3}"),
                   ":2:2: sites[0].groups[0]: unknown key 'speed'");
    expect_refused(SITE_WITH("{" GOOD ",\n \"link\": {\"bandwidth\": \"slow\"}}"),
                   ":2:24: sites[0].groups[0].link.bandwidth: expected a positive bit rate such as "
                   "100mbit or 1gbit, got 'slow'");
    expect_refused(SITE_WITH("{" GOOD ",\n \"link\": {\"loss\": 1}}"),
                   ":2:11: sites[0].groups[0].link: unknown key 'loss'");
}

/* Devices in all groups together fit an int: at most 10^6 (the sum of 2,148 groups of 10^6
 * overflowed: fuzz/corpus/cluster/regression-devices-overflow). Read from memory. */
Test(cluster, at_most_a_million_devices_in_all)
{
    const char *group = "{\"name\": \"g%d\", \"kind\": \"cpu\", \"count\": %d, \"fp32_flops\": 1, "
                        "\"memory\": \"1gb\"}";
    char text[512], one[128];
    for (int count = 500000; count <= 500001; count++) {
        snprintf(text, sizeof text, "{\"sites\": [{\"name\": \"a\", \"groups\": [");
        for (int g = 0; g < 2; g++) {
            snprintf(one, sizeof one, group, g, count);
            strcat(text, g ? ", " : "");
            strcat(text, one);
        }
        strcat(text, "]}]}");
        pt_cluster c;
        pipert_result rc = pt_cluster_parse("mem.json", text, strlen(text), &c);
        if (count == 500000) {
            cr_expect_eq(rc, PIPERT_OK, "%s", pipert_last_error());
            cr_expect_eq(pt_cluster_devices(&c), 1000000);
            pt_cluster_free(&c);
        } else {
            cr_expect_eq(rc, PIPERT_ERR_CONFIG);
            cr_expect(!strncmp(pipert_last_error(), "mem.json:1:", 11) &&
                          strstr(pipert_last_error(),
                                 ": sites[0].groups[1]: more than 1000000 devices in all groups"),
                      "%s", pipert_last_error());
        }
    }
}

/* Every file in examples/clusters loads, with devices in it. */
Test(cluster, every_example_loads)
{
    char folder[512];
    snprintf(folder, sizeof folder, "%s/examples/clusters", PIPERT_SOURCE_ROOT);
    DIR *d = opendir(folder);
    cr_assert_not_null(d, "%s", folder);
    int loaded = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".json") != 0) continue;
        char file[1024];
        snprintf(file, sizeof file, "%s/%s", folder, e->d_name);
        pt_cluster c;
        cr_expect_eq(pt_cluster_load(file, &c), PIPERT_OK, "%s", pipert_last_error());
        cr_expect_gt(pt_cluster_devices(&c), 0, "%s has no devices", e->d_name);
        pt_cluster_free(&c);
        loaded++;
    }
    closedir(d);
    cr_expect_geq(loaded, 8, "only %d example files in %s", loaded, folder);
}

/* The world-wide case of Yuan et al. 2022: every pair of its 8 cities as the
 * authors' table says (one way: half the round trip). */
Test(cluster, yuan2022_case5_is_the_papers_table)
{
    char file[512];
    snprintf(file, sizeof file, "%s/examples/clusters/yuan2022-case5.json", PIPERT_SOURCE_ROOT);
    pt_cluster c;
    cr_assert_eq(pt_cluster_load(file, &c), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(c.n_sites, 8);
    cr_expect_eq(pt_cluster_devices(&c), 64);
    const struct { int a, b; double bits, latency; } pairs[] = {
        {0, 1, 0.79e9, 0.0335},  /* Oregon–Virginia 67 ms, 0.79 Gbit/s */
        {4, 5, 0.342e9, 0.119},  /* Seoul–London 238 ms */
        {5, 6, 1.14e9, 0.007},   /* London–Frankfurt 14 ms */
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        for (int way = 0; way < 2; way++) {
            const int from = way ? pairs[i].b : pairs[i].a, to = way ? pairs[i].a : pairs[i].b;
            const pt_cluster_link *l = &c.links[from * 8 + to];
            cr_expect_float_eq(l->bits_per_s, pairs[i].bits, 1, "%s -> %s", c.site_names[from],
                               c.site_names[to]);
            cr_expect_float_eq(l->latency_s, pairs[i].latency, 1e-9, "%s -> %s",
                               c.site_names[from], c.site_names[to]);
        }
    pt_cluster_free(&c);
}
