package outbox

import "github.com/wmonce/watermill-once/internal/outboxops"

// The operator functions the CLI, the admin page, the janitor and outbox/cdc call; users do
// not (see internal/outboxops).
func init() {
	outboxops.ListRejected = listRejected
	outboxops.RejectedGroups = rejectedGroups
	outboxops.RepublishRejected = republishRejected
	outboxops.RepublishRejectedGroup = republishRejectedGroup
	outboxops.DiscardRejectedGroup = discardRejectedGroup
	outboxops.ParkedGroups = parkedGroups
	outboxops.ReplayParkedGroup = replayParkedGroup
	outboxops.DiscardParkedGroup = discardParkedGroup
	outboxops.RelayActive = relayActive
	outboxops.RegisterSlotPosition = registerSlotPosition
	outboxops.SlotPositions = slotPositions
	outboxops.AdvanceSlotPosition = advanceSlotPosition
	outboxops.ForgetSlotPosition = forgetSlotPosition
	outboxops.CheckPositions = checkAllPositions
	outboxops.RebasePositions = rebasePositions
	outboxops.CheckParking = checkParking
}
