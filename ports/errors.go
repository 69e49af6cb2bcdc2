package ports

import (
	"errors"

	"github.com/checkins/checkins/domain"
)

func errorsIsNotFound(err error) bool { return errors.Is(err, domain.ErrNotFound) }
