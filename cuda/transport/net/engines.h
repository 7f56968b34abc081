// The network engines a group spanning hosts can run its plans' Send/Recv/Wait steps on: one row
// each in engines.cpp, tried in order; the first that can serve the group is used. An engine is a
// folder under transport/net/ implementing NetTransport (transport/net_transport.h); adding one
// is that folder and its row (cuda/README.md, "Recipe: add a transport").
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "transport/net_transport.h"

namespace hoccl {

class FramedP2P;

// What the group hands an engine to build itself from.
struct NetEngineContext {
  int rank = 0, world = 0;
  // Framed gloo messages over the group's point-to-point gloo group (its own send/recv between
  // hosts use them too; gloo's engine shares them).
  std::shared_ptr<FramedP2P> framed;
  std::function<std::string(int)> peerName;  // "rank 3 on host 1 (10.0.0.2)", for errors
  // The rank errors name this side by, where `rank` is a subgroup's (the rail's); -1: `rank`.
  int callerRank = -1;
};

struct NetEngine {
  const char* name;
  std::unique_ptr<NetTransport> transport;
};

// The first engine of the table that can serve `ctx`; throws when none can.
NetEngine createNetEngine(const NetEngineContext& ctx);

}  // namespace hoccl
