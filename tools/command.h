/* Running the system's programs (ip and tc for the test bed, gnuplot for
 * plots): argv exactly as given (no shell), stdout discarded, stderr kept for
 * the error message. */
#ifndef PT_TOOLS_COMMAND_H
#define PT_TOOLS_COMMAND_H

#include <stdbool.h>

#include "pipert/pipert.h"

/* Runs argv[0] (found on PATH) to completion. PIPERT_ERR_IO naming the whole
 * command and what it printed on stderr when it cannot start or exits
 * non-zero; a missing program points at scripts/deps.sh. */
pipert_result pt_run_command(const char *const argv[]);

/* The same, quietly: true when the command ran and exited 0 (probing what
 * the kernel supports, removing what may already be gone). */
bool pt_command_succeeds(const char *const argv[]);

#endif
