#include "common/logging.h"
#include "cuda/runtime.h"
#include "gflow/communicator.h"
