#include "runtime/comm/layout.h"

pipert_result pt_layout_make(int world, int stages, pt_layout *out)
{
    if (world < 1 || stages < 1 || world % stages != 0)
        return pt_fail(PIPERT_ERR_CONFIG, "%d workers cannot form %d pipeline stages: the world "
                                          "size must be a multiple of the stage count",
                       world, stages);
    *out = (pt_layout){.stages = stages, .replicas = world / stages};
    return PIPERT_OK;
}

int pt_layout_rank(const pt_layout *l, int stage, int replica) { return replica * l->stages + stage; }
int pt_layout_stage(const pt_layout *l, int rank) { return rank % l->stages; }
int pt_layout_replica(const pt_layout *l, int rank) { return rank / l->stages; }

pipert_result pt_rank_layout(int rank, int world, int stages, int *stage, int *replica)
{
    pt_layout layout;
    PT_TRY(pt_layout_make(world, stages, &layout));
    if (rank < 0 || rank >= world)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "rank %d is outside [0, %d)", rank, world);
    *stage = pt_layout_stage(&layout, rank);
    *replica = pt_layout_replica(&layout, rank);
    return PIPERT_OK;
}
