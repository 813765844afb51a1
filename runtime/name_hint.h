/* "Did you mean": for a dotted name that is not one of a list (a misspelt configuration key),
 * the name the user most likely meant. */
#ifndef PT_NAME_HINT_H
#define PT_NAME_HINT_H

#include <stddef.h>

/* " (did you mean 'train.lr'?)" for the nearest of names[0..n_names) or of their sections at
 * the unknown name's depth within edit distance 2, else for a name with the same last part in
 * another section ("train.n_layer" -> "model.n_layer"); "" if none. */
void pt_name_hint(const char *unknown, const char *const *names, int n_names, char *out,
                  size_t capacity);

#endif
