// gpurun's liveness keys in its store (docs/store-protocol.md#liveness-keys): a client's SET of
// `gpurun/live/<name>` binds the key to its connection; when the connection closes the server
// deletes it and SETs `gpurun/lost/<name>` = the close time (Unix ms, decimal text).
#pragma once

#include <string_view>

namespace gpurun::store {

inline constexpr std::string_view kLivePrefix = "gpurun/live/";
inline constexpr std::string_view kLostPrefix = "gpurun/lost/";

}  // namespace gpurun::store
