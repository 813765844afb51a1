/* The coupling methods dp/coupling.c chooses from (one file each). */
#ifndef PT_DP_METHODS_H
#define PT_DP_METHODS_H

#include "dp/coupling.h"

extern const pt_coupling_method pt_dp_none;      /* dp/none.c */
extern const pt_coupling_method pt_dp_allreduce; /* dp/allreduce.c */
extern const pt_coupling_method pt_dp_allreduce_nccl; /* dp/allreduce_nccl.c: dp.nccl=true */
extern const pt_coupling_method pt_dp_sparse;    /* dp/sparse.c */
extern const pt_coupling_method pt_dp_diloco;    /* dp/diloco.c */
extern const pt_coupling_method pt_dp_streaming_diloco; /* dp/streaming_diloco.c */
extern const pt_coupling_method pt_dp_co2;       /* dp/co2.c */

/* allreduce's traffic, on the host's ring or on NCCL's */
void pt_dp_allreduce_traffic(const pipert_config *config, pt_coupling_traffic *out);

#endif
