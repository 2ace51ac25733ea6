// The public front door from below.
#pragma once
#include "gflow/communicator.h"
