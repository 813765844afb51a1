/* dp.method=none: the replicas do not couple at all. Each trains on its own
 * share of the batch and nothing crosses between them: the baseline that
 * says what a coupling costs (scripts/bench-wan-methods.sh measures every
 * method's throughput against it on the same processes, cores and links). */
#include <stdlib.h>

#include "dp/codec.h"
#include "dp/methods.h"

static pipert_result none_create(const pt_coupling_options *options, void **out)
{
    const pt_codec_kind compress = options->config->dp.compress;
    if (compress != PT_CODEC_NONE)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "dp.method=none with dp.compress=%s: nothing is sent, so nothing is "
                       "compressed; leave dp.compress at none",
                       pt_config_choice_name("dp.compress", compress));
    *out = NULL;
    return PIPERT_OK;
}

static void none_destroy(void *state) { (void)state; }

static void none_suspend(void *state) { (void)state; }

static pipert_result none_regroup(void *state, const pt_coupling_options *options,
                                  const pt_coupling_point *at)
{
    (void)state, (void)options, (void)at;
    return PIPERT_OK;
}

const pt_coupling_method pt_dp_none = {
    .name = "none",
    .over_all_replicas = true, /* not even inside a site */
    .create = none_create,
    .destroy = none_destroy,
    .suspend = none_suspend,
    .regroup = none_regroup,
};
