#include <criterion/criterion.h>
Test(transport, placeholder) {}
