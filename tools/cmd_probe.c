/* placeholder: being written */
#include "tools/commands.h"
int pt_cmd_probe(int argc, char **argv) { (void)argc; (void)argv; return 1; }
