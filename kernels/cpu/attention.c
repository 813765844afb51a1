/* placeholder: being written */
typedef int pt_placeholder_;
