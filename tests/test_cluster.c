/* Cluster descriptions (scheduler/cluster.h): sites and links read exactly as
 * written, and every malformed file refused naming the file and the field. */
#include <criterion/criterion.h>
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
    cr_expect_str_eq(pipert_last_error(), expected, "for\n%s", text);
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

Test(cluster, malformed_files_are_refused_by_field)
{
    expect_refused("{\"sites\": [{\"name\": \"a\"}, ]}", ":1:27: unexpected token near ']'");
    expect_refused("[]", ": expected a JSON object");
    expect_refused("{\"site\": []}", ": top level: unknown key 'site'");
    expect_refused("{\"sites\": []}", ": sites: expected a list of 1 to 254 sites");
    expect_refused("{\"sites\": [{\"name\": \"a\"}, {\"name\": \"a\"}]}",
                   ": sites[1]: site 'a' is named twice");
    expect_refused("{\"sites\": [{\"nme\": \"a\"}]}", ": sites[0]: unknown key 'nme'");
    expect_refused("{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}]}",
                   ": links: no link from 'a' to 'b' (list it, or give a default_link)");
    expect_refused("{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}], \"links\": [{\"between\": "
                   "[\"a\", \"c\"], \"bandwidth\": \"1gbit\", \"latency\": \"1ms\"}]}",
                   ": links[0]: 'c' is not one of the sites");
    expect_refused("{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}], \"links\": [{\"between\": "
                   "[\"a\", \"b\"], \"bandwidth\": \"fast\", \"latency\": \"1ms\"}]}",
                   ": links[0].bandwidth: expected a positive bit rate such as 100mbit or 1gbit, "
                   "got 'fast'");
    expect_refused("{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}], \"links\": [{\"between\": "
                   "[\"a\", \"b\"], \"bandwidth\": \"1gbit\"}]}",
                   ": links[0]: needs \"latency\", e.g. \"50ms\"");
    expect_refused("{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}], \"links\": [{\"between\": "
                   "[\"a\", \"a\"], \"bandwidth\": \"1gbit\", \"latency\": \"1ms\"}]}",
                   ": links[0]: a link joins two different sites");
}
