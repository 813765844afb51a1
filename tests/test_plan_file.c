/* scheduler/plan_file.h: a plan round-trips through its file; every malformed
 * plan is refused naming the file and the field; sites are checked against
 * the plan's cluster file. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scheduler/plan_file.h"

static char folder[64];

static void make_folder(void)
{
    snprintf(folder, sizeof folder, "/tmp/pipert-plan-XXXXXX");
    cr_assert(mkdtemp(folder));
}

static void remove_folder(void)
{
    char command[128];
    snprintf(command, sizeof command, "rm -rf %s", folder);
    cr_assert_eq(system(command), 0);
}

static const char *write_file(const char *name, const char *text)
{
    static char path[2][256];
    static int which;
    char *p = path[which++ % 2];
    snprintf(p, 256, "%s/%s", folder, name);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static const char *cluster =
    "{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}],"
    " \"default_link\": {\"bandwidth\": \"100mbit\", \"latency\": \"10ms\"}}";

#define PLACEMENT "[[{\"site\": \"a\", \"group\": \"cpu\"}, {\"site\": \"a\"}], [{\"site\": \"b\"}, {\"site\": \"b\"}]]"

Test(plan_file, round_trips, .init = make_folder, .fini = remove_folder)
{
    write_file("cluster.json", cluster);
    const char *path = write_file(
        "plan.json", "{\"format\": \"pipert-plan-1\", \"cluster\": \"cluster.json\", \"stages\": 2, "
                     "\"replicas\": 2, \"layers\": \"2,4\", \"placement\": " PLACEMENT ", "
                     "\"config\": {\"dp\": {\"method\": \"sparse\"}}, "
                     "\"predicted\": {\"step_s\": 0.25, \"tokens_per_s\": 4096}}");
    pt_plan_file plan;
    cr_assert_eq(pt_plan_file_load(path, &plan), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(plan.stages, 2);
    cr_expect_eq(plan.replicas, 2);
    cr_expect_str_eq(plan.layers, "2,4");
    cr_expect_str_eq(plan.placement[0].group, "cpu");
    cr_expect_str_eq(plan.placement[1].group, "");
    cr_expect_str_eq(plan.placement[3].site, "b");
    cr_expect(strstr(plan.cluster_path, "cluster.json"), "%s", plan.cluster_path);
    cr_expect(strstr(plan.config_json, "sparse"), "%s", plan.config_json);
    cr_expect_float_eq(plan.predicted_step_s, 0.25, 1e-12);

    char copy[256];
    snprintf(copy, sizeof copy, "%s/copy.json", folder);
    cr_assert_eq(pt_plan_file_save(copy, &plan), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_neq(access(strcat(strcpy((char[300]){0}, copy), ".tmp"), F_OK), 0, "left a .tmp");
    pt_plan_file again;
    cr_assert_eq(pt_plan_file_load(copy, &again), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(again.stages, plan.stages);
    cr_expect_str_eq(again.layers, plan.layers);
    for (int i = 0; i < 4; i++) {
        cr_expect_str_eq(again.placement[i].site, plan.placement[i].site);
        cr_expect_str_eq(again.placement[i].group, plan.placement[i].group);
    }
    cr_expect_eq(access(again.cluster_path, R_OK), 0, "%s", again.cluster_path);
    cr_expect_str_eq(again.config_json, plan.config_json);
    cr_expect_float_eq(again.predicted_tokens_per_s, 4096, 1e-9);
    pt_cluster c;
    cr_assert_eq(pt_cluster_load(again.cluster_path, &c), PIPERT_OK);
    int index;
    cr_assert_eq(pt_plan_file_site_index(&again, &c, 1, 0, &index), PIPERT_OK);
    cr_expect_eq(index, 1);
    pt_cluster_free(&c);
    pt_plan_file_free(&plan);
    pt_plan_file_free(&again);
}

/* `text` as plan.json is refused with exactly "FOLDER/plan.json" + `after_path`. */
static void expect_refused(const char *text, const char *after_path)
{
    const char *path = write_file("plan.json", text);
    pt_plan_file plan;
    cr_expect_eq(pt_plan_file_load(path, &plan), PIPERT_ERR_CONFIG, "accepted:\n%s", text);
    char expected[1024];
    snprintf(expected, sizeof expected, "%s%s", path, after_path);
    cr_expect_str_eq(pipert_last_error(), expected, "for\n%s", text);
}

#define FORMAT "{\"format\": \"pipert-plan-1\", "
#define ONE_PLACE "\"placement\": [[{\"site\": \"a\"}]]"

Test(plan_file, refusals_name_the_file_position_and_field, .init = make_folder,
     .fini = remove_folder)
{
    /* columns: the value of "stages" at 39, "placement" at 70, its first
     * place at 72, the place's first key at 73, its value at 81, after it 89 */
    expect_refused("{\"format\": \"pipert-plan-2\", \"stages\": 1, \"replicas\": 1, " ONE_PLACE "}",
                   ":1:12: format: expected \"pipert-plan-1\"");
    expect_refused(FORMAT "\"stages\": 0, \"replicas\": 1, \"placement\": [[]]}",
                   ":1:39: stages: expected an integer from 1 to 65536");
    expect_refused(FORMAT "\"stages\": 2, \"replicas\": 1, " ONE_PLACE "}",
                   ":1:71: placement[0]: expected a list of 2 stages");
    expect_refused(FORMAT "\"stages\": 1, \"replicas\": 2, " ONE_PLACE "}",
                   ":1:70: placement: expected a list of 2 replicas (one list of 1 stages each)");
    expect_refused(FORMAT "\"stages\": 1, \"replicas\": 1, \"placement\": [[{\"sites\": \"a\"}]]}",
                   ":1:73: placement[0][0]: unknown key 'sites'");
    expect_refused(FORMAT "\"stages\": 1, \"replicas\": 1, \"placement\": [[{\"site\": \"\"}]]}",
                   ":1:81: placement[0][0].site: expected a name of 1 to 63 characters");
    expect_refused(FORMAT "\"stages\": 1, \"replicas\": 1, " ONE_PLACE ", \"layers\": 3}",
                   ":1:99: layers: expected blocks per stage as a string, e.g. \"3,3\"");
    expect_refused(FORMAT "\"stages\": 1, \"replicas\": 1, " ONE_PLACE ", \"speed\": 3}",
                   ":1:89: top level: unknown key 'speed'");
    expect_refused("[1]", ":1:1: top level: expected an object");
}

Test(plan_file, sites_are_checked_against_the_cluster, .init = make_folder, .fini = remove_folder)
{
    write_file("cluster.json", cluster);
    char expected[512];
    snprintf(expected, sizeof expected, ":4:26: placement[1][0].site: 'c' is not a site of "
             "%s/cluster.json", folder);
    expect_refused(FORMAT "\"cluster\": \"cluster.json\",\n"
                   " \"stages\": 1, \"replicas\": 2,\n"
                   " \"placement\": [[{\"site\": \"a\"}],\n"
                   "               [{\"site\": \"c\"}]]}",
                   expected);
}

Test(plan_file, unreadable_and_malformed_files, .init = make_folder, .fini = remove_folder)
{
    pt_plan_file plan;
    const char *path = write_file("plan.json", FORMAT "\"cluster\": \"missing.json\", \"stages\": 1, "
                                               "\"replicas\": 1, " ONE_PLACE "}");
    cr_expect_eq(pt_plan_file_load(path, &plan), PIPERT_ERR_IO, "a missing cluster file");
    char expected[512];
    snprintf(expected, sizeof expected, "%s:1:40: cluster: %s/missing.json: cannot open", path,
             folder);
    cr_expect(strstr(pipert_last_error(), expected) == pipert_last_error(), "\"%s\" is not \"%s...\"",
              pipert_last_error(), expected);

    snprintf(expected, sizeof expected, "%s/absent.json", folder);
    cr_expect_eq(pt_plan_file_load(expected, &plan), PIPERT_ERR_IO, "a missing plan file");
    cr_expect(strstr(pipert_last_error(), expected), "%s", pipert_last_error());

    path = write_file("plan.json", FORMAT "\n \"stages\": 1,}");
    cr_expect_eq(pt_plan_file_load(path, &plan), PIPERT_ERR_CONFIG, "malformed JSON");
    snprintf(expected, sizeof expected, "%s:2:14: ", path);
    cr_expect(strstr(pipert_last_error(), expected) == pipert_last_error(), "\"%s\" is not \"%s...\"",
              pipert_last_error(), expected);

    /* the product overflowed an int (fuzz/corpus/plan_file/regression-stages-times-replicas-overflow) */
    path = write_file("plan.json", FORMAT "\"stages\": 65536, \"replicas\": 65536, \"placement\": []}");
    cr_expect_eq(pt_plan_file_load(path, &plan), PIPERT_ERR_CONFIG, "65536 x 65536 ranks");
    cr_expect(strstr(pipert_last_error(), "65536 stages × 65536 replicas is more than 65536 ranks"),
              "%s", pipert_last_error());
}

/* The same reader from memory: what the fuzzing harness uses. */
Test(plan_file, parses_from_memory)
{
    const char text[] = "{\"format\": \"pipert-plan-1\", \"cluster\": \"c.json\", \"stages\": 1, "
                        "\"replicas\": 1, \"placement\": [[{\"site\": \"x\"}]]}";
    pt_plan_file plan;
    cr_assert_eq(pt_plan_file_parse("/plans/p.json", text, strlen(text), &plan), PIPERT_OK, "%s",
                 pipert_last_error());
    cr_expect_str_eq(plan.cluster_path, "/plans/c.json"); /* not read: site x is not checked */
    cr_expect_str_eq(plan.placement[0].site, "x");
    pt_plan_file_free(&plan);
    cr_expect_neq(pt_plan_file_parse("/plans/p.json", text, 20, &plan), PIPERT_OK);
    cr_expect(strstr(pipert_last_error(), "/plans/p.json:1:"), "%s", pipert_last_error());
}
