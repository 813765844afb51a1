/* Replays inputs through a harness without libFuzzer: every file named on the
 * command line, and every regular file of every directory named there (in
 * name order), is passed once to LLVMFuzzerTestOneInput. The test suite runs
 * each harness this way over fuzz/corpus/NAME/, so the gcc builds (and their
 * AddressSanitizer + UBSan build) replay every regression input. Fails when it
 * finds no input at all (a mistyped corpus path must not pass). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz/fuzz.h"

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    size_t capacity = 4096, size = 0, n;
    uint8_t *data = malloc(capacity);
    while (data && (n = fread(data + size, 1, capacity - size, f)) > 0) {
        size += n;
        if (size == capacity) {
            uint8_t *grown = realloc(data, capacity *= 2);
            if (!grown) free(data);
            data = grown;
        }
    }
    fclose(f);
    if (!data) return -1;
    /* An exact-size copy, so that AddressSanitizer sees a read one byte past the input. */
    uint8_t *exact = malloc(size ? size : 1);
    if (exact && size) memcpy(exact, data, size);
    free(data);
    if (!exact) return -1;
    LLVMFuzzerTestOneInput(exact, size);
    free(exact);
    return 1;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Files replayed, or -1 on an error. */
static int replay_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: %s does not exist\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) return replay_file(path);
    struct dirent **names;
    int n = scandir(path, &names, NULL, by_name), replayed = 0;
    if (n < 0) return -1;
    for (int i = 0; i < n; i++) {
        char file[4096];
        snprintf(file, sizeof file, "%s/%s", path, names[i]->d_name);
        if (names[i]->d_name[0] != '.' && stat(file, &st) == 0 && S_ISREG(st.st_mode)) {
            int r = replay_file(file);
            replayed = r < 0 || replayed < 0 ? -1 : replayed + r;
        }
        free(names[i]);
    }
    free(names);
    return replayed;
}

int main(int argc, char **argv)
{
    int total = 0;
    for (int i = 1; i < argc; i++) {
        int n = replay_path(argv[i]);
        if (n < 0) return 1;
        total += n;
    }
    printf("replayed %d inputs\n", total);
    return total > 0 ? 0 : 1;
}
