/* Running the system's network tools (ip(8), tc(8) from iproute2) for the
 * test bed: argv exactly as given (no shell), stdout discarded, stderr kept
 * for the error message. */
#ifndef PT_WAN_COMMAND_H
#define PT_WAN_COMMAND_H

#include <stdbool.h>

#include "pipert/pipert.h"

/* Runs argv[0] (found on PATH) to completion. PIPERT_ERR_IO naming the whole
 * command and what it printed on stderr when it cannot start or exits
 * non-zero; the hint for a missing program names the package. */
pipert_result pt_run_command(const char *const argv[]);

/* The same, quietly: true when the command ran and exited 0 (probing what
 * the kernel supports, removing what may already be gone). */
bool pt_command_succeeds(const char *const argv[]);

#endif
