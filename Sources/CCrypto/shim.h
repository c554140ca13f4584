#ifndef SOFA_CCRYPTO_SHIM_H
#define SOFA_CCRYPTO_SHIM_H
#include <openssl/evp.h>
#endif
