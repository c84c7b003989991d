// The one place pscoro includes xtensor from, so a release that moves its headers costs one edit.
#pragma once

#include <pscoro/config.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xexpression.hpp>
#include <xtensor/xtensor.hpp>
