/* Stage splits: the balanced split is the best contiguous split and, of
 * those, the one with the thinnest front (checked against brute force), every block
 * is assigned exactly once, and explicit
 * splits that are not a partition are errors naming the problem. */
#include <criterion/criterion.h>
#include <string.h>

#include "pipeline/plan.h"

static double max_stage_cost(const pt_gpt_config *c, int T, const int *bounds, int S)
{
    double worst = 0;
    for (int s = 0; s < S; s++) {
        double cost = pt_plan_stage_flops(c, T, bounds[s], bounds[s + 1]);
        worst = cost > worst ? cost : worst;
    }
    return worst;
}

/* Calls visit(bounds, context) for every split of L blocks into S non-empty
 * ranges (bounds[0] = 0 on entry, s = 0). */
typedef void split_visitor(const int *bounds, void *context);
static void for_each_split(int L, int S, int *bounds, int s, split_visitor *visit, void *context)
{
    if (s == S - 1) {
        bounds[S] = L;
        visit(bounds, context);
        return;
    }
    for (int cut = bounds[s] + 1; cut <= L - (S - 1 - s); cut++) {
        bounds[s + 1] = cut;
        for_each_split(L, S, bounds, s + 1, visit, context);
    }
}

typedef struct split_search {
    const pt_gpt_config *model;
    int T, S;
    double best;         /* the cheapest "most expensive stage" seen */
    double limit;        /* splits costing at most this are optimal */
    const int *balanced; /* pt_plan_balanced's bounds */
    bool earlier;        /* an optimal split has a boundary before balanced's */
} split_search;

static void keep_cheapest(const int *bounds, void *context)
{
    split_search *q = context;
    const double cost = max_stage_cost(q->model, q->T, bounds, q->S);
    q->best = cost < q->best ? cost : q->best;
}

static void look_for_an_earlier_boundary(const int *bounds, void *context)
{
    split_search *q = context;
    if (max_stage_cost(q->model, q->T, bounds, q->S) > q->limit) return;
    for (int k = 1; k < q->S; k++) q->earlier |= bounds[k] < q->balanced[k];
}

/* The cheapest "most expensive stage" over every split of L blocks into S
 * non-empty ranges. */
static double brute_force(const pt_gpt_config *c, int T, int S)
{
    split_search q = {.model = c, .T = T, .S = S, .best = 1e300};
    int bounds[PT_PLAN_MAX_STAGES + 1] = {0};
    for_each_split(c->n_layer, S, bounds, 0, keep_cheapest, &q);
    return q.best;
}

Test(plan, balanced_split_is_optimal)
{
    const int widths[] = {64, 256, 768};
    const int vocabs[] = {256, 4096, 50257};
    for (int w = 0; w < 3; w++)
        for (int L = 1; L <= 10; L++)
            for (int S = 1; S <= L && S <= 5; S++) {
                pt_gpt_config c = {.n_layer = L, .n_embd = widths[w], .n_head = 4,
                                   .block_size = 256, .vocab_size = vocabs[w]};
                pt_stage_plan plan;
                cr_assert_eq(pt_plan_balanced(&c, 256, S, &plan), PIPERT_OK, "%s", pipert_last_error());
                cr_assert_eq(plan.bounds[0], 0);
                cr_assert_eq(plan.bounds[S], L);
                for (int s = 0; s < S; s++)
                    cr_assert_lt(plan.bounds[s], plan.bounds[s + 1], "L=%d S=%d: stage %d empty", L, S, s);
                double best = brute_force(&c, 256, S);
                double got = max_stage_cost(&c, 256, plan.bounds, S);
                cr_assert(got <= best * (1 + 1e-9), "C=%d L=%d S=%d: worst stage %.4g, best %.4g",
                          widths[w], L, S, got, best);
                /* of the optimal splits, the thinnest front: no boundary of any is earlier */
                split_search q = {.model = &c, .T = 256, .S = S, .balanced = plan.bounds,
                                  .limit = best * (1 + 1e-9)};
                int bounds[PT_PLAN_MAX_STAGES + 1] = {0};
                for_each_split(L, S, bounds, 0, look_for_an_earlier_boundary, &q);
                cr_assert_not(q.earlier, "C=%d L=%d S=%d: an optimal split has an earlier boundary",
                              widths[w], L, S);
            }
}

/* Of the optimal splits, the balanced one puts the fewest blocks on the front
 * stages (checked against every optimal split above); on the staleness study's
 * model that is 1,2,2,1, not 2,2,1,1, which costs as much. */
Test(plan, ties_leave_the_front_stages_thin)
{
    pt_gpt_config study = {.n_layer = 6, .n_embd = 192, .n_head = 6, .block_size = 128,
                           .vocab_size = 256};
    pt_stage_plan plan;
    cr_assert_eq(pt_plan_balanced(&study, 128, 4, &plan), PIPERT_OK);
    const int expected[] = {0, 1, 3, 5, 6};
    for (int s = 0; s <= 4; s++)
        cr_expect_eq(plan.bounds[s], expected[s], "bounds[%d] = %d (1,2,2,1 expected)", s,
                     plan.bounds[s]);
}

Test(plan, the_head_weighs_on_the_last_stage)
{
    /* GPT-2 small: the 50257×768 head costs about 4.5 blocks of 1024 tokens */
    pt_gpt_config c = {.n_layer = 12, .n_embd = 768, .n_head = 12, .block_size = 1024, .vocab_size = 50257};
    pt_stage_plan plan;
    cr_assert_eq(pt_plan_balanced(&c, 1024, 4, &plan), PIPERT_OK);
    const int last_blocks = plan.bounds[4] - plan.bounds[3];
    cr_expect_eq(last_blocks, 1, "the last stage holds %d blocks beside the head", last_blocks);
}

Test(plan, explicit_splits)
{
    pt_stage_plan plan;
    cr_assert_eq(pt_plan_parse("3,3,3,3", 12, 4, &plan), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(plan.bounds[2], 6);
    cr_assert_eq(pt_plan_parse("1,5", 6, 2, &plan), PIPERT_OK);
    cr_expect_eq(plan.bounds[1], 1);

    struct { const char *spec; int L, S; const char *phrase; } bad[] = {
        {"3,3,3", 12, 4, "3 entries for 4 stages"},
        {"3,3,3,2", 12, 4, "blocks 11..11 left out"},
        {"4,4,4,4", 12, 4, "more than model.n_layer=12"},
        {"3,0,3,6", 12, 4, "stage 1 gets 0 blocks"},
        {"3,3,x,3", 12, 4, "not a list"},
        {"3,3,3,3,", 12, 4, "not a list"},
        {"6,6,0", 12, 2, "more entries"},
        {"1,1,1", 2, 3, "every stage needs at least one block"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(pt_plan_parse(bad[i].spec, bad[i].L, bad[i].S, &plan), PIPERT_ERR_CONFIG, "%s",
                     bad[i].spec);
        cr_expect(strstr(pipert_last_error(), bad[i].phrase) != NULL, "%s: message '%s' lacks '%s'",
                  bad[i].spec, pipert_last_error(), bad[i].phrase);
    }
}
