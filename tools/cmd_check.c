/* pipert check: one forward and backward on given weights and tokens, every
 * gradient written out. It is how pipert is compared with other frameworks,
 * so it reads weights written by other tools under the Hugging Face GPT-2
 * names as well as pipert's own checkpoints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "models/gpt.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/memory.h"
#include "runtime/safetensors.h"
#include "runtime/topology.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "train/checkpoint.h"

typedef struct check_request {
    const char *model_path, *tokens_path, *out_path;
    int B, T;
} check_request;

/* Tokens [0, B·T) are the inputs and [1, B·T] the targets. */
static pipert_result read_tokens(const check_request *req, int vocab_size, int32_t *inputs,
                                 int32_t *targets)
{
    uint16_t *tokens;
    size_t count, need = (size_t)req->B * req->T + 1;
    PT_TRY(pt_shard_read(req->tokens_path, &tokens, &count));
    pipert_result rc = PIPERT_OK;
    if (count < need)
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s: holds %zu tokens, --batch %d --seq %d needs %zu",
                     req->tokens_path, count, req->B, req->T, need);
    for (size_t i = 0; rc == PIPERT_OK && i < need; i++)
        if (tokens[i] >= vocab_size)
            rc = pt_fail(PIPERT_ERR_FORMAT, "%s: token %zu is %u, beyond model.vocab_size=%d",
                         req->tokens_path, i, tokens[i], vocab_size);
    for (size_t i = 0; rc == PIPERT_OK && i + 1 < need; i++) {
        inputs[i] = tokens[i];
        targets[i] = tokens[i + 1];
    }
    free(tokens);
    return rc;
}

static pipert_result write_gradients(const check_request *req, const pt_gpt_slice *model,
                                     float loss, const pipert_config *cfg)
{
    float *grads;
    PT_TRY(pt_alloc((void **)&grads, model->n_params * sizeof(float), "gradients"));
    model->kernels->copy_to_host(grads, model->grads, model->n_params * sizeof(float));
    pt_safetensors_writer *w = NULL;
    char loss_text[32], *config_json = pipert_config_to_json(cfg);
    snprintf(loss_text, sizeof loss_text, "%.9g", (double)loss);
    pipert_result rc = pt_safetensors_writer_create(&w);
    if (rc == PIPERT_OK) rc = pt_gpt_add_to_writer(w, model, grads, "");
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(w, "loss", loss_text);
    if (rc == PIPERT_OK && config_json) rc = pt_safetensors_writer_set_metadata(w, "config", config_json);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_write(w, req->out_path);
    pt_safetensors_writer_free(w);
    free(config_json);
    pt_free(grads);
    return rc;
}

static pipert_result run_check(const check_request *req, pipert_config *cfg, int argc, char **argv)
{
    pt_safetensors *st;
    PT_TRY(pt_safetensors_open(&st, req->model_path));
    pt_gpt_slice *model = NULL;
    int32_t *inputs = NULL, *targets = NULL;
    pt_topology *topology = NULL;
    pipert_result rc = pt_model_settings_from_file(st, cfg);
    if (rc == PIPERT_OK) rc = pt_cli_apply_overrides(argc, argv, cfg); /* flags win */
    pt_gpt_config config = pt_gpt_config_from_settings(cfg);
    if (rc == PIPERT_OK && config.n_head == 0)
        rc = pt_fail(PIPERT_ERR_CONFIG,
                     "%s: model.n_head is not in its metadata and n_embd=%d is not a multiple of "
                     "64: pass --model.n_head=N",
                     req->model_path, config.n_embd);
    if (rc == PIPERT_OK) rc = pt_gpt_config_check(&config, req->model_path);
    if (rc == PIPERT_OK && req->T > config.block_size)
        rc = pt_fail(PIPERT_ERR_INVALID_ARG, "--seq %d exceeds the model's block_size %d", req->T,
                     config.block_size);
    if (rc == PIPERT_OK) rc = pt_topology_load(&topology);
    if (rc == PIPERT_OK) pt_kernels_cpu_set_threads(pt_topology_cores(topology));
    if (rc == PIPERT_OK)
        rc = pt_gpt_slice_create(&model, &config, 0, config.n_layer, req->B, req->T,
                                 pt_kernels_cpu());
    if (rc == PIPERT_OK) rc = pt_gpt_load_params(model, st);
    const size_t N = (size_t)req->B * req->T;
    if (rc == PIPERT_OK) rc = pt_alloc((void **)&inputs, N * sizeof(int32_t), "input tokens");
    if (rc == PIPERT_OK) rc = pt_alloc((void **)&targets, N * sizeof(int32_t), "target tokens");
    if (rc == PIPERT_OK) rc = read_tokens(req, config.vocab_size, inputs, targets);
    if (rc == PIPERT_OK) {
        model->kernels->copy_to_device(model->tokens, inputs, N * sizeof(int32_t));
        model->kernels->copy_to_device(model->targets, targets, N * sizeof(int32_t));
        float loss = 0;
        pt_gpt_zero_grads(model);
        pt_gpt_forward(model, 1.0f, &loss);
        pt_gpt_backward(model, NULL);
        rc = write_gradients(req, model, loss, cfg);
        if (rc == PIPERT_OK) printf("loss %.6f; gradients of %d tensors written to %s\n",
                                    (double)loss, model->n_tensors, req->out_path);
    }
    pt_free(inputs);
    pt_free(targets);
    pt_gpt_slice_free(model);
    pt_topology_free(topology);
    pt_safetensors_close(st);
    return rc;
}

int pt_cmd_check(int argc, char **argv)
{
    const char *batch = NULL, *seq = NULL;
    check_request req = {0};
    const pt_cli_flag flags[] = {
        {"--model", "M.safetensors", "weights: a pipert checkpoint or Hugging Face GPT-2 names", &req.model_path, NULL},
        {"--tokens", "T.bin", "llm.c token shard; inputs [0, B·T), targets [1, B·T]", &req.tokens_path, NULL},
        {"--batch", "B", "sequences", &batch, NULL},
        {"--seq", "T", "sequence length", &seq, NULL},
        {"--out", "G.safetensors", "gradients by parameter name; metadata \"loss\"", &req.out_path, NULL},
    };
    const pt_cli cli = {"check",
                        "--model M.safetensors --tokens T.bin --batch B --seq T --out G.safetensors "
                        "[--model.key=value ...]",
                        "One forward and backward pass; writes the mean loss and every gradient.\n"
                        "The model configuration comes from M's \"config\" metadata, or is inferred\n"
                        "from its tensor shapes; --model.* flags override it.",
                        flags, (int)(sizeof flags / sizeof flags[0]), true, NULL};
    pipert_config *cfg;
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, &cfg);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    pipert_result rc = PIPERT_OK;
    if (!req.model_path || !req.tokens_path || !req.out_path || !batch || !seq)
        rc = pt_fail(PIPERT_ERR_INVALID_ARG, "--model, --tokens, --out, --batch and --seq are required");
    if (rc == PIPERT_OK) rc = pt_cli_parse_int("--batch", batch, 1, 1 << 20, 0, &req.B);
    if (rc == PIPERT_OK) rc = pt_cli_parse_int("--seq", seq, 1, 1 << 20, 0, &req.T);
    if (rc == PIPERT_OK) rc = run_check(&req, cfg, argc, argv);
    pipert_config_free(cfg);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("check");
}
