#include "pipeline/utilisation.h"

#include "runtime/clock.h"

static double clamp_share(double x) { return x < 0 ? 0 : x > 1 ? 1 : x; }

void pt_utilisation_start(pt_utilisation_meter *m, pt_transport *transport)
{
    *m = (pt_utilisation_meter){.started_wall = pt_now_s(), .started_cpu = pt_process_cpu_s()};
    if (transport) pt_transport_bytes_sent(transport, &m->sent_local, &m->sent_remote);
}

pt_utilisation_mark pt_utilisation_mark_now(void)
{
    return (pt_utilisation_mark){pt_now_s(), pt_process_cpu_s()};
}

void pt_utilisation_add_pipeline_wait(pt_utilisation_meter *m, pt_utilisation_mark mark)
{
    const pt_utilisation_mark now = pt_utilisation_mark_now();
    m->pipeline_wall += now.wall - mark.wall;
    m->pipeline_cpu += now.cpu - mark.cpu;
}

void pt_utilisation_add_coupling_wait(pt_utilisation_meter *m, double wall_s, double cpu_s)
{
    m->coupling_wall += wall_s;
    m->coupling_cpu += cpu_s;
}

pt_utilisation pt_utilisation_finish(pt_utilisation_meter *m, pt_transport *transport, int threads)
{
    const pt_utilisation_mark now = pt_utilisation_mark_now();
    const double wall = now.wall - m->started_wall;
    const double compute_cpu = now.cpu - m->started_cpu - m->pipeline_cpu - m->coupling_cpu;
    pt_utilisation u = {0};
    if (wall > 0) {
        u.wait_pipeline = clamp_share(m->pipeline_wall / wall);
        u.wait_coupling = clamp_share(m->coupling_wall / wall);
        /* Threads beside the compute threads (the transport's) may add CPU
         * time outside the waits: computing cannot take more than the rest. */
        const double outside_waits = clamp_share(1 - u.wait_pipeline - u.wait_coupling);
        const double compute = compute_cpu / ((threads > 0 ? threads : 1) * wall);
        u.compute = clamp_share(compute < outside_waits ? compute : outside_waits);
    }
    if (transport) {
        uint64_t local, remote;
        pt_transport_bytes_sent(transport, &local, &remote);
        u.bytes_site = (double)(local - m->sent_local);
        u.bytes_wan = (double)(remote - m->sent_remote);
    }
    pt_utilisation_start(m, transport);
    return u;
}
