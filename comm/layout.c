#include "comm/layout.h"

#include <stdbool.h>

/* The rank of a cell of the grid: rows are replicas and columns stages, or the
 * other way round when transposed. */
static int cell_rank(const pt_layout *l, bool transposed, int row, int col)
{
    return transposed ? pt_layout_rank(l, row, col) : pt_layout_rank(l, col, row);
}

/* Row r of the cycle enters at column entry(r) and leaves at entry(r + 1)
 * (its next row enters through the same column), visiting the rest of the row
 * between: so entry must differ from one row to the next, around the cycle.
 * An even number of rows alternates 0, 1; an odd number, with 3 or more
 * columns, goes 0, 1, 2, 1, 2, ..., 2 (then back to 0). */
static int entry(int row, int rows)
{
    row %= rows;
    if (rows % 2 == 0) return row % 2;
    return row == 0 ? 0 : 2 - row % 2;
}

void pt_layout_world_ring(const pt_layout *l, int *ranks)
{
    const int world = l->stages * l->replicas;
    if (l->stages == 1 || l->replicas == 1) { /* one row or one column: complete */
        for (int r = 0; r < world; r++) ranks[r] = r;
        return;
    }
    /* rows are replicas; with an odd number of them and two stages, rows are stages */
    const bool transposed = l->replicas % 2 == 1 && l->stages == 2;
    const int rows = transposed ? l->stages : l->replicas, cols = transposed ? l->replicas : l->stages;
    int n = 0;
    for (int row = 0; row < rows; row++) {
        const int in = entry(row, rows), out = entry(row + 1, rows);
        ranks[n++] = cell_rank(l, transposed, row, in);
        for (int col = 0; col < cols; col++)
            if (col != in && col != out) ranks[n++] = cell_rank(l, transposed, row, col);
        ranks[n++] = cell_rank(l, transposed, row, out);
    }
}

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
    pt_layout layout = {0};
    PT_TRY(pt_layout_make(world, stages, &layout));
    if (rank < 0 || rank >= world)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "rank %d is outside [0, %d)", rank, world);
    *stage = pt_layout_stage(&layout, rank);
    *replica = pt_layout_replica(&layout, rank);
    return PIPERT_OK;
}
