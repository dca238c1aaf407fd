package stage

import (
	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/mem"
)

// workspaceBytes is the working memory node id's kernel holds while it
// runs, forward or backward.
func workspaceBytes(c *costmodel.Costs, id int, backward bool) mem.Bytes {
	return mem.Bytes(c.ScratchBytes(id, backward))
}
