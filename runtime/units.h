/* Quantities written with units, as people and tc(8) write them:
 * bit rates ("100mbit", "1gbit", "1.5Gbit/s") and durations ("50ms", "2s",
 * "250us") and sizes ("80gib"). Decimal prefixes (k = 1000) for rates, as
 * link speeds are quoted. */
#ifndef PT_UNITS_H
#define PT_UNITS_H

#include "pipert/pipert.h"

/* "100mbit" → 1e8 bits per second. Units: bit, kbit, mbit, gbit, tbit (any
 * case, an optional "/s" or "ps"). The rate must be positive and finite.
 * PIPERT_ERR_CONFIG naming `what` otherwise. */
pipert_result pt_parse_bit_rate(const char *text, const char *what, double *bits_per_s);

/* "80gib" → 80·2³⁰ bytes. Units: b, kb, mb, gb, tb (powers of 1000) and kib,
 * mib, gib, tib (powers of 1024), any case. Positive and finite. */
pipert_result pt_parse_byte_size(const char *text, const char *what, double *bytes);

/* "50ms" → 0.05 seconds. Units: s, ms, us; "0" alone is zero. Not negative.
 * PIPERT_ERR_CONFIG naming `what` otherwise. */
pipert_result pt_parse_duration(const char *text, const char *what, double *seconds);

/* 1e8 → "100 Mbit/s", 0.05 → "50 ms": for messages and tables. */
void pt_format_bit_rate(double bits_per_s, char *text, size_t cap);
void pt_format_duration(double seconds, char *text, size_t cap);

#endif
