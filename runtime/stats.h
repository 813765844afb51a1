/* Small statistics over measurements. */
#ifndef PT_STATS_H
#define PT_STATS_H

#include <stdlib.h>

static inline int pt_compare_doubles_(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts values[0..n) in place and returns their median (n ≥ 1). */
static inline double pt_median(double *values, size_t n)
{
    qsort(values, n, sizeof *values, pt_compare_doubles_);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

#endif
