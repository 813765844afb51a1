/* The public C API as an embedding program uses it: results, messages, no
 * exits. Only <pipert/pipert.h> is included. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipert/pipert.h"

static pipert_config *small_config(void)
{
    pipert_config *cfg = NULL;
    cr_assert_eq(pipert_config_create(&cfg), PIPERT_OK);
    const char *settings[] = {"model.n_layer=1", "model.n_embd=32", "model.n_head=2",
                              "model.block_size=16", "train.batch_size=2", "train.steps=3",
                              "train.warmup_steps=1", "train.val_batches=1", "--runtime.threads=1"};
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
        cr_assert_eq(pipert_config_set(cfg, settings[i]), PIPERT_OK, "%s: %s", settings[i],
                     pipert_last_error());
    return cfg;
}

Test(api, train_returns_a_summary)
{
    char dir[] = "/tmp/pipert-api-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    pipert_config *cfg = small_config();
    pipert_train_options options = {.out_dir = dir, .quiet = 1};
    pipert_train_summary summary;
    cr_assert_eq(pipert_train(cfg, &options, &summary), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(summary.steps_done, 3);
    cr_expect(isfinite(summary.last_loss) && summary.last_loss > 0);
    cr_expect(isfinite(summary.last_val_loss));
    /* a byte-level model starts near ln(256) = 5.5 */
    cr_expect(summary.last_loss < 6.0f, "loss %f", (double)summary.last_loss);
    pipert_config_free(cfg);
}

Test(api, errors_are_results_with_messages)
{
    pipert_config *cfg = small_config();
    cr_expect_eq(pipert_config_set(cfg, "train.no_such_key=1"), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "no_such_key") != NULL, "%s", pipert_last_error());
    cr_expect_eq(pipert_config_load_file(cfg, "/nonexistent/run.json"), PIPERT_ERR_IO);
    cr_expect(strstr(pipert_last_error(), "/nonexistent/run.json") != NULL, "%s", pipert_last_error());
    cr_expect_eq(pipert_config_set(cfg, "data.path=/nonexistent/corpus.txt"), PIPERT_OK);
    pipert_train_options options = {.out_dir = "/tmp", .quiet = 1};
    pipert_train_summary summary;
    cr_expect_neq(pipert_train(cfg, &options, &summary), PIPERT_OK);
    cr_expect(strstr(pipert_last_error(), "corpus.txt") != NULL, "%s", pipert_last_error());
    cr_expect_eq(pipert_train(NULL, &options, &summary), PIPERT_ERR_INVALID_ARG);
    cr_expect_str_eq(pipert_result_str(PIPERT_ERR_FORMAT), "malformed file");
    cr_expect_str_eq(pipert_result_str((pipert_result)999), "unknown result");
    cr_expect_str_eq(pipert_version(), "0.1.0");
    char *json = pipert_config_to_json(cfg);
    cr_assert_not_null(json);
    cr_expect(strstr(json, "\"n_embd\": 32") != NULL, "%s", json);
    free(json);
    pipert_config_free(cfg);
}
