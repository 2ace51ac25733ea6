// An upward include: common (0) may not include core (5).
#pragma once
#include "core/engine.h"
