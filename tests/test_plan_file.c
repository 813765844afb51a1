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

Test(plan_file, refusals_name_the_file_and_field, .init = make_folder, .fini = remove_folder)
{
    write_file("cluster.json", cluster);
    const struct {
        const char *text, *expected;
    } cases[] = {
        {"{\"format\": \"pipert-plan-2\", \"stages\": 1, \"replicas\": 1, \"placement\": [[{\"site\": \"a\"}]]}",
         "format: expected"},
        {"{\"format\": \"pipert-plan-1\", \"stages\": 0, \"replicas\": 1, \"placement\": [[]]}",
         "stages: expected an integer"},
        {"{\"format\": \"pipert-plan-1\", \"stages\": 2, \"replicas\": 1, \"placement\": [[{\"site\": \"a\"}]]}",
         "placement[0]: expected a list of 2 stages"},
        {"{\"format\": \"pipert-plan-1\", \"stages\": 1, \"replicas\": 2, \"placement\": [[{\"site\": \"a\"}]]}",
         "placement: expected a list of 2 replicas"},
        {"{\"format\": \"pipert-plan-1\", \"stages\": 1, \"replicas\": 1, \"placement\": [[{\"sites\": \"a\"}]]}",
         "placement[0][0]: unknown key 'sites'"},
        {"{\"format\": \"pipert-plan-1\", \"stages\": 1, \"replicas\": 1, \"placement\": [[{\"site\": \"\"}]]}",
         "placement[0][0]: needs a \"site\""},
        {"{\"format\": \"pipert-plan-1\", \"stages\": 1, \"replicas\": 1, \"placement\": [[{\"site\": \"a\"}]], \"layers\": 3}",
         "layers: expected blocks per stage"},
        {"{\"format\": \"pipert-plan-1\", \"stages\": 1, \"replicas\": 1, \"placement\": [[{\"site\": \"a\"}]], \"speed\": 3}",
         "plan: unknown key 'speed'"},
        {"{\"format\": \"pipert-plan-1\", \"cluster\": \"cluster.json\", \"stages\": 1, \"replicas\": 1, \"placement\": [[{\"site\": \"c\"}]]}",
         "placement[0][0]: site 'c' is not in the cluster"},
        {"{\"format\": \"pipert-plan-1\", \"cluster\": \"missing.json\", \"stages\": 1, \"replicas\": 1, \"placement\": [[{\"site\": \"a\"}]]}",
         "missing.json"},
        {"{\"format\": \"pipert-plan-1\",", "plan.json:1:"},
        /* the product overflowed an int (fuzz/corpus/plan_file/regression-stages-times-replicas-overflow) */
        {"{\"format\": \"pipert-plan-1\", \"stages\": 65536, \"replicas\": 65536, \"placement\": []}",
         "65536 stages × 65536 replicas is more than 65536 ranks"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *path = write_file("plan.json", cases[k].text);
        pt_plan_file plan;
        cr_expect_neq(pt_plan_file_load(path, &plan), PIPERT_OK, "case %zu was accepted", k);
        cr_expect(strstr(pipert_last_error(), cases[k].expected) &&
                      strstr(pipert_last_error(), "plan.json"),
                  "case %zu: \"%s\" does not say \"%s\"", k, pipert_last_error(), cases[k].expected);
    }
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
