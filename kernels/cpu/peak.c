/* placeholder */
typedef int pt_placeholder_;
