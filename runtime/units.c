#include "runtime/units.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "runtime/error.h"

typedef struct unit {
    const char *name;
    double scale;
} unit;

/* The number at the start of text, and where it ends; false when there is none. */
static bool leading_number(const char *text, double *value, const char **rest)
{
    char *end;
    *value = strtod(text, &end);
    *rest = end;
    return end != text && isfinite(*value);
}

static bool find_unit(const unit *units, int n, const char *name, double *scale)
{
    for (int i = 0; i < n; i++)
        if (!strcasecmp(units[i].name, name)) {
            *scale = units[i].scale;
            return true;
        }
    return false;
}

pipert_result pt_parse_bit_rate(const char *text, const char *what, double *bits_per_s)
{
    static const unit units[] = {
        {"bit", 1},           {"kbit", 1e3},         {"mbit", 1e6},         {"gbit", 1e9},
        {"tbit", 1e12},       {"bit/s", 1},          {"kbit/s", 1e3},       {"mbit/s", 1e6},
        {"gbit/s", 1e9},      {"tbit/s", 1e12},      {"bps", 1},            {"kbps", 1e3},
        {"mbps", 1e6},        {"gbps", 1e9},         {"tbps", 1e12},
    };
    double value, scale;
    const char *rest;
    if (!text || !leading_number(text, &value, &rest) ||
        !find_unit(units, (int)(sizeof units / sizeof units[0]), rest, &scale) || !(value > 0))
        return pt_fail(PIPERT_ERR_CONFIG,
                       "%s: expected a positive bit rate such as 100mbit or 1gbit, got '%s'", what,
                       text ? text : "(null)");
    *bits_per_s = value * scale;
    return PIPERT_OK;
}

pipert_result pt_parse_byte_size(const char *text, const char *what, double *bytes)
{
    static const unit units[] = {
        {"b", 1},         {"kb", 1e3},       {"mb", 1e6},       {"gb", 1e9},
        {"tb", 1e12},     {"kib", 1024.0},   {"mib", 1048576.0}, {"gib", 1073741824.0},
        {"tib", 1099511627776.0},
    };
    double value, scale;
    const char *rest;
    if (!text || !leading_number(text, &value, &rest) ||
        !find_unit(units, (int)(sizeof units / sizeof units[0]), rest, &scale) || !(value > 0))
        return pt_fail(PIPERT_ERR_CONFIG,
                       "%s: expected a positive size such as 80gib or 512mb, got '%s'", what,
                       text ? text : "(null)");
    *bytes = value * scale;
    return PIPERT_OK;
}

pipert_result pt_parse_duration(const char *text, const char *what, double *seconds)
{
    static const unit units[] = {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}};
    double value, scale;
    const char *rest;
    bool ok = text && leading_number(text, &value, &rest) && value >= 0;
    if (ok && *rest == '\0') ok = value == 0; /* a bare number is ambiguous unless zero */
    else if (ok) ok = find_unit(units, (int)(sizeof units / sizeof units[0]), rest, &scale);
    if (!ok)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "%s: expected a duration such as 50ms, 2s or 250us, got '%s'", what,
                       text ? text : "(null)");
    *seconds = *rest ? value * scale : 0;
    return PIPERT_OK;
}

void pt_format_bit_rate(double bits_per_s, char *text, size_t cap)
{
    static const unit units[] = {{"Tbit/s", 1e12}, {"Gbit/s", 1e9}, {"Mbit/s", 1e6}, {"kbit/s", 1e3}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (bits_per_s >= units[i].scale) {
            snprintf(text, cap, "%.4g %s", bits_per_s / units[i].scale, units[i].name);
            return;
        }
    snprintf(text, cap, "%.4g bit/s", bits_per_s);
}

void pt_format_duration(double seconds, char *text, size_t cap)
{
    if (seconds >= 1) snprintf(text, cap, "%.4g s", seconds);
    else if (seconds >= 1e-3 || seconds == 0) snprintf(text, cap, "%.4g ms", seconds * 1e3);
    else snprintf(text, cap, "%.4g us", seconds * 1e6);
}
