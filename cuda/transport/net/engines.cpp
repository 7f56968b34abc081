#include "transport/net/engines.h"

#include <stdexcept>

#include "transport/net/gloo/gloo_net_transport.h"

namespace hoccl {
namespace {

struct EngineRow {
  const char* name;
  bool (*canServe)(const NetEngineContext&);
  std::unique_ptr<NetTransport> (*create)(const NetEngineContext&);
};

// gloo serves every group: its framed messages run over the group's own gloo connections.
const EngineRow kEngines[] = {
    {"gloo", [](const NetEngineContext& c) { return c.framed != nullptr; },
     [](const NetEngineContext& c) -> std::unique_ptr<NetTransport> {
       return std::make_unique<GlooNetTransport>(c.framed, c.world, c.peerName, c.callerRank);
     }},
};

}  // namespace

NetEngine createNetEngine(const NetEngineContext& ctx) {
  for (const EngineRow& row : kEngines)
    if (row.canServe(ctx)) return {row.name, row.create(ctx)};
  throw std::runtime_error("hoccl process group creation on rank " + std::to_string(ctx.rank) +
                           ": no network engine can serve this group");
}

}  // namespace hoccl
