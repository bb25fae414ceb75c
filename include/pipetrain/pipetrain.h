// The umbrella header: everything a user of pipetrain needs.
#pragma once

#include "pipetrain/error.h"
#include "pipetrain/util/blas.h"
#include "pipetrain/util/log.h"
#include "pipetrain/version.h"
#include "pipetrain/batch/batch.h"
#include "pipetrain/batch/data_iterator.h"
#include "pipetrain/partition/layer_spec.h"
#include "pipetrain/partition/balance.h"
#include "pipetrain/partition/min_max.h"
#include "pipetrain/engine/config.h"
