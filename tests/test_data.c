/* placeholder: being written */
#include <criterion/criterion.h>
Test(placeholder, empty) {}
