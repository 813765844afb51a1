/* The subcommands of the `pipert` tool. Each takes the arguments after its
 * name and returns the process exit status. */
#ifndef PT_COMMANDS_H
#define PT_COMMANDS_H

int pt_cmd_train(int argc, char **argv);
int pt_cmd_check(int argc, char **argv);
int pt_cmd_bench(int argc, char **argv);
int pt_cmd_probe(int argc, char **argv);
int pt_cmd_launch(int argc, char **argv);
int pt_cmd_worker(int argc, char **argv);
int pt_cmd_coordinator(int argc, char **argv);
int pt_cmd_trace(int argc, char **argv);
int pt_cmd_plot(int argc, char **argv);
int pt_cmd_simulate(int argc, char **argv);
int pt_cmd_plan(int argc, char **argv);

/* Prints "pipert: error: <last error>" and returns the exit status 1. */
int pt_cmd_report_failure(const char *command);

#endif
