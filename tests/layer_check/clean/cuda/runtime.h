#pragma once
#include "common/logging.h"
#include "gflow/types.h"
