/* "Did you mean": the nearest of a list of dotted names (runtime/name_hint.h). */
#include "runtime/name_hint.h"

#include <stdio.h>
#include <string.h>

#define HINT_NAME_MAX 128 /* longest dotted name compared; longer ones get no hint */

/* Levenshtein distance of two short strings (at most HINT_NAME_MAX bytes),
 * or `limit` if it is limit or more: the search stops as soon as no
 * alignment can come in under it (every unknown key is compared with every
 * key, so this is on the path of each misspelt override). */
static int edit_distance(const char *a, const char *b, int limit)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > HINT_NAME_MAX || lb > HINT_NAME_MAX) return limit;
    if ((la > lb ? la - lb : lb - la) >= (size_t)limit) return limit;
    int row[HINT_NAME_MAX + 1]; /* row[j]: distance of a[0..i) and b[0..j) */
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diagonal = row[0], smallest = (int)i;
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int substitute = diagonal + (a[i - 1] != b[j - 1]);
            int best = row[j] + 1 < row[j - 1] + 1 ? row[j] + 1 : row[j - 1] + 1;
            diagonal = row[j];
            row[j] = substitute < best ? substitute : best;
            smallest = row[j] < smallest ? row[j] : smallest;
        }
        if (smallest >= limit) return limit; /* rows never decrease downwards */
    }
    return row[lb] < limit ? row[lb] : limit;
}

static int count_dots(const char *s)
{
    int dots = 0;
    for (; *s; s++) dots += *s == '.';
    return dots;
}

/* The first `count` components of a dotted name ("train.lr", 1 -> "train"). */
static void leading_components(const char *name, int count, char *out, size_t capacity)
{
    size_t length = 0;
    for (int seen = 0; name[length] && !(name[length] == '.' && ++seen == count); length++) {}
    snprintf(out, capacity, "%.*s", (int)length, name);
}

static const char *leaf_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

void pt_name_hint(const char *unknown, const char *const *names, int n_names, char *out,
                  size_t capacity)
{
    char best[HINT_NAME_MAX + 1] = "";
    int best_distance = 3, depth = count_dots(unknown);
    for (int i = 0; i < n_names; i++) {
        /* The candidate of this depth from this key: the key itself, or its section. */
        if (count_dots(names[i]) < depth) continue;
        char candidate[HINT_NAME_MAX + 1];
        leading_components(names[i], depth + 1, candidate, sizeof candidate);
        int distance = edit_distance(unknown, candidate, best_distance);
        if (distance > 0 && distance < best_distance) { /* 0: a section named as a key */
            best_distance = distance;
            snprintf(best, sizeof best, "%s", candidate);
        }
    }
    for (int i = 0; i < n_names && !best[0]; i++)
        if (strcmp(leaf_of(names[i]), leaf_of(unknown)) == 0)
            snprintf(best, sizeof best, "%s", names[i]);
    snprintf(out, capacity, best[0] ? " (did you mean '%s'?)" : "%s", best);
}
