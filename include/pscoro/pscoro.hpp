// Everything pscoro offers, in one include.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/checkpoint.hpp>
#include <pscoro/cluster_spec.hpp>
#include <pscoro/coordinator.hpp>
#include <pscoro/data_formats.hpp>
#include <pscoro/dataset.hpp>
#include <pscoro/dtype.hpp>
#include <pscoro/error.hpp>
#include <pscoro/hash_table.hpp>
#include <pscoro/hash_table_options.hpp>
#include <pscoro/initializers.hpp>
#include <pscoro/log.hpp>
#include <pscoro/optimizers.hpp>
#include <pscoro/partitioners.hpp>
#include <pscoro/per_worker.hpp>
#include <pscoro/progress.hpp>
#include <pscoro/remote_value.hpp>
#include <pscoro/server.hpp>
#include <pscoro/sharded_variable.hpp>
#include <pscoro/sparse_ids.hpp>
#include <pscoro/strategy.hpp>
#include <pscoro/summary.hpp>
#include <pscoro/tensor.hpp>
#include <pscoro/transport_options.hpp>
#include <pscoro/value.hpp>
#include <pscoro/variable.hpp>
#include <pscoro/worker_function.hpp>
#include <pscoro/xtensor.hpp>
