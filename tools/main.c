/* `pipert`: the command-line tool over libpipert. */
#include <stdio.h>
#include <string.h>

#include "pipert/pipert.h"
#include "tools/commands.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand commands[] = {
    {"train", pt_cmd_train, "train a model on one worker (metrics, checkpoints, --resume)"},
    {"check", pt_cmd_check, "one forward and backward on given weights and tokens; writes every gradient"},
    {"bench", pt_cmd_bench, "time training steps; median ms/step, tokens/s, GFLOP/s, % of peak"},
    {"probe", pt_cmd_probe, "measure this machine's fp32 GEMM peak and print its topology"},
    {"launch", pt_cmd_launch, "start stages x replicas workers on this machine, with a coordinator"},
    {"worker", pt_cmd_worker, "one worker of a job (started by launch, srun or mpirun)"},
    {"coordinator", pt_cmd_coordinator, "a job's coordinator: launch starts it; --listen: for srun/mpirun"},
    {"plot", pt_cmd_plot, "PNG pictures of runs: loss against tokens and wall time, bytes between sites"},
    {"plan", pt_cmd_plan, "choose stages, replicas, split and sites for a cluster; write a plan file"},
    {"simulate", pt_cmd_simulate, "predict a job of S stages x R replicas: step time, bubble, memory, bytes"},
    {"trace", pt_cmd_trace, "merge the per-rank traces of a run into one timeline; bubble per rank"},
};

static void print_usage(FILE *out)
{
    fprintf(out, "usage: pipert COMMAND [OPTIONS]   (pipert COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n  --version  print the version\n  --help     print this help\n"
                 "\nenvironment: PIPERT_LOG=error|warn|info|debug (default info)\n");
}

int pt_cmd_report_failure(const char *command)
{
    const char *message = pipert_last_error();
    fprintf(stderr, "pipert %s: error: %s\n", command, *message ? message : "unknown failure");
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("pipert %s\n", pipert_version());
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 2, argv + 2);
    fprintf(stderr, "pipert: unknown command '%s'\n", argv[1]);
    print_usage(stderr);
    return 2;
}
