// cuwarden daemon model: chunked event history (see history.hpp).
#include "model/history.hpp"

namespace cuw::daemon {

void EventHistory::push(const StoredEvent& ev) {
  view_.reset();
  if (tail_.size() == kChunk) {
    sealed_.push_back(std::make_shared<const Chunk>(std::move(tail_)));
    tail_ = Chunk();
    tail_.reserve(kChunk);
  }
  tail_.push_back(ev);
  ++size_;
  while (size_ > capacity_) {
    ++skip_;
    --size_;
    if (!sealed_.empty() && skip_ == sealed_.front()->size()) {
      sealed_.pop_front();
      skip_ = 0;
    }
  }
}

std::shared_ptr<const EventHistory::View> EventHistory::view() {
  if (view_) return view_;
  auto v = std::make_shared<View>();
  v->chunks.reserve(sealed_.size() + 1);
  for (const auto& c : sealed_) v->chunks.push_back(c);
  if (!tail_.empty()) v->chunks.push_back(std::make_shared<const Chunk>(tail_));
  v->skip = size_ ? skip_ : 0;
  view_ = std::move(v);
  return view_;
}

}  // namespace cuw::daemon
