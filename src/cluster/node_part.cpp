#include "nereus/cluster/node_part.hpp"

#include "nereus/base/error.hpp"

namespace nereus::cluster {

asio::awaitable<bool> NodePart::handle(Channel& ch, const Envelope& m) {
  Answer a;
  std::string failure;
  try {
    if (std::holds_alternative<Finish>(m.body) && takes_finish()) {
      co_await close();
      a = Body{Finished{}};
    } else {
      a = co_await answer(ch, m);
    }
  } catch (const Error& e) {
    failure = e.what();
  }
  if (!failure.empty()) a = Body{Failed{failure}};
  if (std::holds_alternative<NotMine>(a)) co_return false;
  if (auto* body = std::get_if<Body>(&a)) co_await ch.reply(m.request_id, *body);
  co_return true;
}

}  // namespace nereus::cluster
