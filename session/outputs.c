/* What a session writes for people and plots: DIR/metrics.jsonl (the last
 * stage of replica 0, which has the loss; after replicas left, of the first
 * replica still in the job) and DIR/metrics-stage-N.jsonl
 * (each stage of replica 0 in a multi-worker job: staleness, bubble and the
 * coupling's traffic and waits). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/clock.h"
#include "runtime/fileio.h"
#include "session/session_internal.h"

/* The elapsed_s of the last line of path that has one, or 0: where a resumed
 * run's wall time goes on from (the pause between the two processes is not
 * counted). */
static double last_elapsed_s(const char *path)
{
    char *text;
    size_t size;
    double elapsed = 0;
    if (pt_read_file(path, &text, &size) != PIPERT_OK) return 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        json_t *value = json_loads(line, 0, NULL);
        json_t *field = json_object_get(value, "elapsed_s");
        if (json_is_number(field)) elapsed = json_number_value(field);
        json_decref(value);
    }
    free(text);
    return elapsed;
}

pipert_result pt_session_open_outputs(pipert_session *s, long resumed_step)
{
    char path[PT_CONFIG_STRING_MAX + 48];
    PT_TRY(pt_make_dirs(s->out_dir));
    if (s->job.replica == 0 && s->job.world > 1) {
        snprintf(path, sizeof path, "%s/metrics-stage-%d.jsonl", s->out_dir, s->job.stage);
        PT_TRY(pt_metrics_open(&s->stage_metrics, path, resumed_step));
    }
    if (!s->writes_outputs || s->metrics.file) return PIPERT_OK; /* open: handed over (join.c) */
    snprintf(path, sizeof path, "%s/metrics.jsonl", s->out_dir);
    PT_TRY(pt_metrics_open(&s->metrics, path, resumed_step));
    s->elapsed_before = resumed_step >= 0 ? last_elapsed_s(path) : 0;
    return PIPERT_OK;
}

/* metrics.jsonl is the first replica's still in the job: after a regroup it may move to
 * another replica's last stage, or back. The one that takes it keeps the lines through
 * `step` (its predecessor wrote them: it stopped at its own switch, or died before). */
pipert_result pt_session_hand_over_outputs(pipert_session *s, long step)
{
    const pt_job *job = &s->job;
    int first = 0;
    while (first < job->layout.replicas - 1 && job->replica_left[first]) first++;
    const bool writes = job->replica == first && job->stage == job->layout.stages - 1;
    if (writes == s->writes_outputs) return PIPERT_OK;
    s->writes_outputs = writes;
    if (!writes) {
        pt_metrics_close(&s->metrics);
        return PIPERT_OK;
    }
    char path[PT_CONFIG_STRING_MAX + 48];
    snprintf(path, sizeof path, "%s/metrics.jsonl", s->out_dir);
    PT_TRY(pt_metrics_open(&s->metrics, path, step));
    pt_info("this worker writes %s from step %ld on", path, step + 1);
    return PIPERT_OK;
}

void pt_session_close_outputs(pipert_session *s)
{
    pt_metrics_close(&s->metrics);
    pt_metrics_close(&s->stage_metrics);
}

/* pipeline/utilisation.h: shares of the step's wall time, bytes per link class. */
static void add_utilisation(json_t *line, const pt_utilisation *u)
{
    if (!line) return;
    json_object_set_new(line, "util_compute", json_real(u->compute));
    json_object_set_new(line, "util_wait_pipeline", json_real(u->wait_pipeline));
    json_object_set_new(line, "util_wait_coupling", json_real(u->wait_coupling));
    json_object_set_new(line, "bytes_site", json_real(u->bytes_site));
    json_object_set_new(line, "bytes_wan", json_real(u->bytes_wan));
}

/* Where the run is, for plots: tokens the whole job trained on by this step,
 * and seconds of training (over every process of a resumed run). */
static void add_progress(const pipert_session *s, json_t *line, long step)
{
    if (!line) return;
    json_object_set_new(line, "tokens",
                        json_real(s->tokens_per_step * (double)step - s->elastic.tokens_lost));
    json_object_set_new(line, "elapsed_s",
                        json_real(s->elapsed_before + pt_now_s() - s->run_started));
    if (!s->job.elastic) return;
    pt_membership_news news;
    pt_job_membership((pt_job *)&s->job, &news);
    json_object_set_new(line, "replicas", json_integer(s->job.layout.replicas - s->elastic.absent));
    json_object_set_new(line, "departures", json_integer(news.departures));
    json_object_set_new(line, "joins", json_integer(news.joins));
}

static pipert_result write_stage_line(pipert_session *s, const pt_pipeline_step *p)
{
    json_t *line = json_pack("{s:I, s:i, s:f, s:f, s:f, s:f, s:s, s:s, s:f, s:f, s:f}", "step",
                             (json_int_t)p->step, "stage", s->job.stage, "staleness", p->staleness,
                             "bubble", pt_trace_bubble_fraction(s->trace), "grad_norm",
                             p->grad_norm, "ms_per_step", 1e3 * p->seconds, "dp_method",
                             p->dp.method ? p->dp.method : "none", "dp_compress",
                             pt_config_choice_name("dp.compress", s->config.dp.compress),
                             "dp_bytes", p->dp.bytes_sent,
                             "dp_wait_ms", p->dp.wait_ms, "dp_delay", p->dp.delay);
    add_utilisation(line, &p->util);
    return pt_metrics_write(&s->stage_metrics, line);
}

static pipert_result write_loss_line(pipert_session *s, const pt_pipeline_step *p,
                                     double tokens_per_s)
{
    json_t *line = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "step", (json_int_t)p->step,
                             "loss", (double)p->loss, "lr", p->lr, "grad_norm", p->grad_norm,
                             "tokens_per_s", tokens_per_s, "ms_per_step", 1e3 * p->seconds,
                             "staleness", p->staleness);
    add_progress(s, line, p->step);
    return pt_metrics_write(&s->metrics, line);
}

pipert_result pt_session_write_step(pipert_session *s, const pt_pipeline_step *p,
                                    double tokens_per_s)
{
    if (s->stage_metrics.file) PT_TRY(write_stage_line(s, p));
    if (s->writes_outputs) PT_TRY(write_loss_line(s, p, tokens_per_s));
    return PIPERT_OK;
}

pipert_result pt_session_write_validation(pipert_session *s, long step, float val_loss)
{
    if (!s->writes_outputs) return PIPERT_OK;
    json_t *line = json_pack("{s:I, s:f}", "step", (json_int_t)step, "val_loss", (double)val_loss);
    add_progress(s, line, step);
    return pt_metrics_write(&s->metrics, line);
}
